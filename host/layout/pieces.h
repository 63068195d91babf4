/* What a rank computes in one step, piece by piece. A FWD or a BWD of a stage (an instruction
 * of the rank's schedule list, host/sched) is its pieces in order: forward the embedding, the
 * stage's layers, the head with the final norm; backward the same in reverse. Each piece reads
 * the parameters of at most two units (0 the embedding, 1 + l layer l, L + 1 the final norm and
 * the head; a tied head reads the embedding too; the embedding's backward reads none).
 *
 * The executor (exec.c) runs every FWD and BWD through these pieces (dp_passes.c), and ZeRO-3
 * gathers a piece's units just before it, started while the piece before computes; the memory
 * bill (bill.c) replays the same pieces over the same list to count those gathers and the
 * parameters they hold at once. One expansion for both, so the bill is the run's.
 *
 * Pure: no comm layer, no runtime memory. */
#ifndef TYCHO_LAYOUT_PIECES_H
#define TYCHO_LAYOUT_PIECES_H
#include <stddef.h>

#include "plan/plan.h"
#include "layout/params.h"
#include "sched/sched.h"

enum piece_kind { PIECE_EMBED_FWD, PIECE_LAYER_FWD, PIECE_HEAD_FWD, PIECE_HEAD_BWD, PIECE_LAYER_BWD,
                  PIECE_EMBED_BWD };

struct piece {
  enum piece_kind kind;
  int layer; /* PIECE_LAYER_*: the layer; else −1 */
};

/* The pieces of stage st's forward (backward = 0) or backward (1), in the order they run, into
 * out (room for st->n_layers + 2). Returns how many. */
int pieces_of_stage(const struct plan_stage *st, int backward, struct piece *out);
/* The units piece pc reads (n_layers L, tied: the head is the embedding): how many, into units. */
int piece_units(struct piece pc, int n_layers, int tied, int units[2]);
/* The compute instruction (FWD or BWD) after list->instr[i] when it is of the same stage and
 * micro-batch (the backward right after its forward: its first piece's parameters are gathered
 * while the forward's last piece computes, and units both read stay held); else NULL. */
const struct sched_instr *pieces_follower(const struct sched_list *list, int i);
/* The first piece of instruction in (FWD or BWD of p's stage in->stage). */
struct piece pieces_first(const struct plan *p, const struct sched_instr *in);

/* last[s] = the index in list of stage s's last BWD, or on a split list its last BWD_W (−1:
 * none), for the n_stages stages: the backward after which its gradients are complete and,
 * under zero_every.params = "step", its gathered units are freed. */
void pieces_last_backwards(const struct sched_list *list, int n_stages, int *last);
/* ZeRO-3 over rank's list: before each piece its units are gathered unless held and the next
 * piece's (the rest of the instruction, then pieces_follower's first) are started; after it,
 * every unit of the piece's stage that the next piece does not read is freed, except with
 * keep_for_step (zero_every.params = "step") before the stage's last backward, where nothing is.
 * unit_elems[u] is what a gather of unit u holds (elements; or bytes, a bf16 plan's copies with
 * them: *peak_held is in the same measure) and unit_calls[u] the all-gathers it takes (one per
 * bucket), unit_gather_elems[u] the elements those all-gathers move. Sums the calls and moved
 * elements of a step and finds the most held at once. 0, or −1 out of
 * memory. */
int pieces_zero3_replay(const struct plan *p, const struct sched_list *list, int keep_for_step,
                        const size_t *unit_elems, const int *unit_calls, const size_t *unit_gather_elems,
                        unsigned long long *calls, unsigned long long *moved, size_t *peak_held);
/* A bf16 plan under ZeRO 3: the bf16 copies of the parameters first_param ..
 * last_param of table t (a unit's), which the runtime allocates with the unit's gather and frees
 * with it. Their elements, padding included (0: none), and in *start where the first copy starts
 * among the copies as t lays them out (each parameter's bf16_offset is relative to it). */
size_t pieces_unit_bf16(const struct layout_params *t, int first_param, int last_param, size_t *start);

/* The executor's activation slots per stage of pipeline rank pp_rank under schedule s (its
 * peak micro-batches in flight, plus one while a given-back slot's send is still in flight; on
 * a split list a micro-batch is in flight until its BWD_W, which reads the slot):
 * (n_stages) entries, 0 for the stages elsewhere. The executor allocates them; the memory bill
 * counts them. */
void pieces_stage_slots(const struct plan *p, const struct sched *s, int pp_rank, int *slots);
/* A split list (zero-bubble): the most micro-batches past their BWD_B and before their BWD_W at
 * once, each holding its linears' output gradients (the executor's struct exec_split; 0 on a
 * whole list). */
int pieces_split_held(const struct sched_list *list);

#endif
