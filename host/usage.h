/* The usage text: `tycho --help` (every command) and `tycho COMMAND --help` (one command's
 * section, with the plan options where it takes them, and the exit codes). */
#ifndef TYCHO_USAGE_H
#define TYCHO_USAGE_H
#include <stdio.h>

/* The whole text of `tycho --help`. */
const char *usage_text(void);

/* Writes the usage of `command` (check, tune, run, repl, rehearse, calibrate, ckpt) to f. 0, or
 * -1 when it is not a command. */
int usage_print_command(FILE *f, const char *command);

/* 1 when the arguments after argv[1] ask for its usage (--help or -h). */
int usage_asked(int argc, char **argv);

#endif
