/* The trainer in Lua: tycho.open and the trainer object a REPL drives (docs/repl.md, "The trainer
 * in Lua"). For a normal, trusted Lua state with the standard libraries — the REPL's — never the
 * plan sandbox. Every function that touches the job (open, step, eval, save, load, set, gather,
 * replan, close) is collective over the world: every rank runs the same chunk. What the module
 * prints goes through the state's global `print`, so the REPL can capture each rank's output. */
#ifndef TYCHO_RUNTIME_BINDING_H
#define TYCHO_RUNTIME_BINDING_H
#include <lua.h>

/* Adds tycho.open to the `tycho` table on the stack top, or pushes a new table (with
 * tycho.version) when the top is not a table; registers the trainer's and the tensor's
 * metatables, and makes numbers callable with a trainer as first argument (so that t.step is the
 * step count and t:step(n) still steps). Returns 1: the table is on the stack top. */
int luaopen_tycho_runtime(lua_State *L);

/* The interruption hook of t:step(n): stop(ctx) is called before each step; 1 stops t:step there
 * (it prints "interrupted at step N" and returns normally), 2 raises "interrupted at step N"
 * (the REPL's answer to every later t:step of a chunk already interrupted, so a loop of steps
 * ends too). The REPL's hook agrees over the world, so every rank gets the same answer. NULL
 * (the default): never. */
void tycho_runtime_set_stop_hook(int (*stop)(void *ctx), void *ctx);

/* The tokenizer of t:generate's text prompts, given by the command layer (the tokenizers are
 * above the bindings): load a tokenizer.json (or the folder holding one; NULL with the message),
 * encode text as `tycho generate --prompt` does (malloc'd ids; 0, or −1 with the message),
 * decode ids into malloc'd text (NULL when it cannot), close, and the eos id generation stops
 * at (-1: none). NULL (the default): text prompts are refused. */
struct tycho_text_codec {
  void *(*load)(const char *path, char *err, size_t err_size);
  int (*encode)(void *tok, const char *text, size_t len, int **ids, int *n, char *err, size_t err_size);
  char *(*decode)(void *tok, const int *ids, long long n, size_t *len);
  void (*close)(void *tok);
  long long (*eos)(void *tok);
};
void tycho_runtime_set_text_codec(const struct tycho_text_codec *codec);

/* Trainers the garbage collector finalized while peers exist are set aside, not closed (closing
 * is collective, and each rank collects at its own moment): their serial numbers (the n-th
 * tycho.open, the same on every rank) into serials (room for max); returns how many there are.
 * tycho_runtime_close_collected closes those of serials (every rank the same list, in the same
 * order: collective). The REPL agrees on the list at the end of every chunk. */
int tycho_runtime_collected(unsigned long long *serials, int max);
void tycho_runtime_close_collected(const unsigned long long *serials, int n);

/* Sets the global `name` in L to a trainer object for t, a trainer this process opened and
 * closes itself (`tycho run --listen`'s, for the attached REPL): the object's methods and fields
 * work on it as on tycho.open's, but t:close() and t:replan() are refused (the job owns its
 * layout and its end) and collecting the object leaves the trainer open. */
struct trainer;
void tycho_runtime_bind_borrowed(lua_State *L, struct trainer *t, const char *name);

#endif
