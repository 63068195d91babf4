/* `tycho check` output: the compiled plan for people (compact at any world size) and as one
 * JSON document for programs (docs/check-json.md). */
#ifndef TYCHO_CHECK_H
#define TYCHO_CHECK_H
#include <stdio.h>

#include "plan/plan.h"
#include "util/strbuf.h"

void check_print_text(const struct plan *p, FILE *f);
void check_write_json(const struct plan *p, struct strbuf *b);

#endif
