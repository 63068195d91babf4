/* A step's pieces (pieces.h). */
#include "layout/pieces.h"

#include <stdlib.h>
#include <string.h>

int pieces_of_stage(const struct plan_stage *st, int backward, struct piece *out)
{
  int n = 0;
  const int first = st->first_layer, nl = first >= 0 ? st->n_layers : 0;
  if (!backward) {
    if (st->has_embed)
      out[n++] = (struct piece){ PIECE_EMBED_FWD, -1 };
    for (int l = first; l < first + nl; l++)
      out[n++] = (struct piece){ PIECE_LAYER_FWD, l };
    if (st->has_head)
      out[n++] = (struct piece){ PIECE_HEAD_FWD, -1 };
  } else {
    if (st->has_head)
      out[n++] = (struct piece){ PIECE_HEAD_BWD, -1 };
    for (int l = first + nl - 1; l >= first; l--)
      out[n++] = (struct piece){ PIECE_LAYER_BWD, l };
    if (st->has_embed)
      out[n++] = (struct piece){ PIECE_EMBED_BWD, -1 };
  }
  return n;
}

int piece_units(struct piece pc, int n_layers, int tied, int units[2])
{
  switch (pc.kind) {
  case PIECE_EMBED_FWD: units[0] = 0; return 1;
  case PIECE_LAYER_FWD: case PIECE_LAYER_BWD: units[0] = 1 + pc.layer; return 1;
  case PIECE_HEAD_FWD: case PIECE_HEAD_BWD: units[0] = n_layers + 1; units[1] = 0; return tied ? 2 : 1;
  case PIECE_EMBED_BWD: return 0;
  }
  return 0;
}

static int is_compute(const struct sched_instr *in)
{
  return in->op == SCHED_FWD || in->op == SCHED_BWD || in->op == SCHED_BWD_B || in->op == SCHED_BWD_W;
}

const struct sched_instr *pieces_follower(const struct sched_list *list, int i)
{
  for (int j = i + 1; j < list->n; j++) {
    const struct sched_instr *in = &list->instr[j];
    if (!is_compute(in))
      continue;
    return in->stage == list->instr[i].stage && in->mb == list->instr[i].mb ? in : NULL;
  }
  return NULL;
}

struct piece pieces_first(const struct plan *p, const struct sched_instr *in)
{
  const struct plan_stage *st = &p->stages[in->stage];
  const int layers = st->first_layer >= 0 && st->n_layers > 0;
  if (in->op != SCHED_FWD) { /* a backward, whole or either half of a split one */
    if (st->has_head)
      return (struct piece){ PIECE_HEAD_BWD, -1 };
    return layers ? (struct piece){ PIECE_LAYER_BWD, st->first_layer + st->n_layers - 1 }
                  : (struct piece){ PIECE_EMBED_BWD, -1 };
  }
  if (st->has_embed)
    return (struct piece){ PIECE_EMBED_FWD, -1 };
  return layers ? (struct piece){ PIECE_LAYER_FWD, st->first_layer } : (struct piece){ PIECE_HEAD_FWD, -1 };
}

/* Whether stage st's pieces read unit u (as dp_passes.c's stage_reads). */
static int stage_reads(const struct plan *p, const struct plan_stage *st, int u)
{
  const int L = p->model.n_layers;
  if (u == 0)
    return st->has_embed || (st->has_head && p->model.tie_embeddings);
  if (u == L + 1)
    return st->has_head;
  return st->first_layer >= 0 && u - 1 >= st->first_layer && u - 1 < st->first_layer + st->n_layers;
}

void pieces_last_backwards(const struct sched_list *list, int n_stages, int *last)
{
  for (int s = 0; s < n_stages; s++) last[s] = -1;
  for (int i = 0; i < list->n; i++)
    if (list->instr[i].op == SCHED_BWD || list->instr[i].op == SCHED_BWD_W)
      last[list->instr[i].stage] = i;
}

int pieces_zero3_replay(const struct plan *p, const struct sched_list *list, int keep_for_step,
                        const size_t *unit_elems, const int *unit_calls, const size_t *unit_gather_elems,
                        unsigned long long *calls, unsigned long long *moved, size_t *peak_held)
{
  const int L = p->model.n_layers, tied = p->model.tie_embeddings, U = L + 2;
  int max_layers = 0;
  for (int s = 0; s < p->n_stages; s++)
    max_layers = p->stages[s].n_layers > max_layers ? p->stages[s].n_layers : max_layers;
  struct piece *pcs = malloc((size_t)(max_layers + 2) * sizeof *pcs);
  char *held = calloc((size_t)U, 1), *needed = calloc((size_t)U, 1);
  int *last = malloc((size_t)p->n_stages * sizeof *last);
  if (!pcs || !held || !needed || !last) {
    free(pcs);
    free(held);
    free(needed);
    free(last);
    return -1;
  }
  pieces_last_backwards(list, p->n_stages, last);
  *calls = *moved = 0;
  *peak_held = 0;
  size_t now = 0;
  for (int i = 0; i < list->n; i++) {
    const struct sched_instr *in = &list->instr[i];
    if (!is_compute(in))
      continue;
    const struct plan_stage *st = &p->stages[in->stage];
    const int keep = keep_for_step && !(in->op != SCHED_FWD && last[in->stage] == i);
    const struct sched_instr *after = pieces_follower(list, i);
    struct piece then;
    if (after)
      then = pieces_first(p, after);
    const int n = pieces_of_stage(st, in->op != SCHED_FWD, pcs);
    for (int k = 0; k < n; k++) {
      const struct piece *next = k + 1 < n ? &pcs[k + 1] : after ? &then : NULL;
      int u[4], nu = piece_units(pcs[k], L, tied, u);
      if (next)
        nu += piece_units(*next, L, tied, u + nu);
      for (int a = 0; a < nu; a++) {
        if (held[u[a]])
          continue;
        held[u[a]] = 1;
        now += unit_elems[u[a]];
        *calls += (unsigned long long)unit_calls[u[a]];
        *moved += (unsigned long long)unit_gather_elems[u[a]];
      }
      *peak_held = now > *peak_held ? now : *peak_held;
      if (keep)
        continue;
      /* freed: what the next piece does not read (under keep_for_step, in the stage's last
       * backward: what no later piece of it reads) */
      memset(needed, 0, (size_t)U);
      int need[2], nk = next ? piece_units(*next, L, tied, need) : 0;
      for (int b = 0; b < nk; b++) needed[need[b]] = 1;
      for (int j = k + 2; keep_for_step && j < n; j++) {
        int more[2], nm = piece_units(pcs[j], L, tied, more);
        for (int b = 0; b < nm; b++) needed[more[b]] = 1;
      }
      for (int x = 0; x < U; x++) {
        if (held[x] && !needed[x] && stage_reads(p, st, x)) {
          held[x] = 0;
          now -= unit_elems[x];
        }
      }
    }
  }
  free(pcs);
  free(held);
  free(needed);
  free(last);
  return 0;
}

void pieces_stage_slots(const struct plan *p, const struct sched *s, int pp_rank, int *slots)
{
  const int S = p->n_stages;
  int *used = calloc((size_t)S * ((size_t)s->m + 1), sizeof *used); /* (stage, mb) holds a slot */
  int *now = calloc((size_t)S, sizeof *now);
  for (int k = 0; k < S; k++) slots[k] = 0;
  if (!used || !now) { /* no memory to count: one slot per micro-batch, always enough */
    for (int k = 0; k < S; k++) slots[k] = p->stages[k].pp_rank == pp_rank ? s->m + 1 : 0;
    free(used);
    free(now);
    return;
  }
  const struct sched_list *list = &s->ranks[pp_rank];
  for (int i = 0; i < list->n; i++) {
    const struct sched_instr *in = &list->instr[i];
    int st = -1, take = 0;
    switch ((enum sched_op)in->op) {
    case SCHED_RECV_ACT: st = in->stage + 1; take = 1; break;
    case SCHED_FWD: st = in->stage; take = 1; break;
    case SCHED_SEND_GRAD: st = in->stage; take = s->split ? 0 : -1; break;
    case SCHED_BWD: st = in->stage; take = p->stages[in->stage].has_embed ? -1 : 0; break;
    case SCHED_BWD_W: st = in->stage; take = -1; break; /* W reads the slot's saved inputs */
    default: break;
    }
    if (st < 0 || !take)
      continue;
    int *u = &used[(size_t)st * ((size_t)s->m + 1) + (size_t)in->mb];
    if (take > 0 && !*u) {
      *u = 1;
      if (++now[st] > slots[st])
        slots[st] = now[st];
    } else if (take < 0 && *u) {
      *u = 0;
      now[st]--;
    }
  }
  for (int k = 0; k < S; k++)
    if (p->stages[k].pp_rank == pp_rank)
      slots[k] += s->pp > 1; /* room while a given-back slot's send is still in flight */
  free(used);
  free(now);
}

int pieces_split_held(const struct sched_list *list)
{
  int past_b = 0, peak = 0;
  for (int i = 0; i < list->n; i++) {
    past_b += list->instr[i].op == SCHED_BWD_B ? 1 : list->instr[i].op == SCHED_BWD_W ? -1 : 0;
    peak = past_b > peak ? past_b : peak;
  }
  return peak;
}

size_t pieces_unit_bf16(const struct layout_params *t, int first_param, int last_param, size_t *start)
{
  /* the copies are packed in table order: a unit's run from its first copy to the next unit's
   * first (or the end), the padding after its last included */
  int first = -1;
  for (int i = first_param; i >= 0 && i <= last_param && first < 0; i++)
    first = t->p[i].bf16_offset != LAYOUT_NO_BF16 ? i : -1;
  *start = 0;
  if (first < 0)
    return 0;
  size_t end = t->n_bf16;
  for (int i = last_param + 1; i < t->n && end == t->n_bf16; i++)
    end = t->p[i].bf16_offset != LAYOUT_NO_BF16 ? t->p[i].bf16_offset : end;
  *start = t->p[first].bf16_offset;
  return end - *start;
}
