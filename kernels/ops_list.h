/* The kernel table's entries, once: each is one line of this list, with its contract beside it
 * (the legend and the conventions are ops.h's). Everything else that names every entry is made
 * from here: the members of struct kernel_ops, the CPU's and the CUDA's tables and prototypes,
 * and the tests' wrapping tables. So adding an entry is a line here, its kernels and its tests.
 *
 * Included more than once on purpose (no include guard): the includer defines what an entry
 * becomes, then includes this file, which undefines the macros at its end.
 *   KERNEL_OP(ret, op, params, args)       a kernel;
 *   KERNEL_OP_BF16(ret, op, params, args)  a bf16-compute kernel: NULL in a table without bf16
 *                                          (the float64 build's); KERNEL_OP when not defined;
 *   KERNEL_OP_BF16_OPT(ret, op, params, args)  a bf16-compute kernel a backend may leave NULL
 *                                          (the CUDA one does): the runtime then calls the fp32
 *                                          entry it stands for; KERNEL_OP_BF16 when not defined;
 *   KERNEL_BACKEND(ret, op, params, args)  the backend's own service (memory, status), which
 *                                          each backend and each wrapping table writes itself;
 *                                          KERNEL_OP when not defined.
 * ret is the return type, op the member's name, params the parameters after `void *ctx` (every
 * entry takes the backend's context first) and args the same names for forwarding a call, both
 * in parentheses (ops.h: KERNEL_UNPACK, KERNEL_RETURN). */
#ifndef KERNEL_OP_BF16
#define KERNEL_OP_BF16 KERNEL_OP
#endif
#ifndef KERNEL_OP_BF16_OPT
#define KERNEL_OP_BF16_OPT KERNEL_OP_BF16
#endif
#ifndef KERNEL_BACKEND
#define KERNEL_BACKEND KERNEL_OP
#endif

/* ---- memory ----
 * Every tensor the runtime computes on lives in the backend's memory. The runtime reads and
 * writes it only through these entries (host/runtime/model/hostview.h), never by dereferencing, so a
 * backend whose memory the host cannot address (a GPU) needs no change above kernels/. */
/* n_bytes of the backend's memory, zeroed, 64-byte aligned; NULL when out of it (n_bytes 0: a
 * valid, unique block). The allocator's device hooks (host/runtime/model/alloc.h). */
KERNEL_BACKEND(void *, mem_alloc, (size_t n_bytes), (n_bytes))
KERNEL_BACKEND(void, mem_free, (void *block), (block))
/* dst ← src, n_bytes, both in the backend's memory; they may overlap. */
KERNEL_BACKEND(void, copy, (void *dst, const void *src, size_t n_bytes), (dst, src, n_bytes))
/* n_rows rows of row_bytes each: src + r·src_pitch → dst + r·dst_pitch (bytes), both in the
 * backend's memory; no row of dst overlaps a row of src. */
KERNEL_BACKEND(void, copy_rows,
               (void *dst, size_t dst_pitch, const void *src, size_t src_pitch, size_t row_bytes,
                size_t n_rows),
               (dst, dst_pitch, src, src_pitch, row_bytes, n_rows))
/* dst ← 0, n_bytes. */
KERNEL_BACKEND(void, zero, (void *dst, size_t n_bytes), (dst, n_bytes))
/* host ← src (backend memory), n_bytes; returns once host holds the bytes, after every call
 * made before it on ctx. */
KERNEL_BACKEND(void, to_host, (void *host, const void *src, size_t n_bytes), (host, src, n_bytes))
/* dst (backend memory) ← host, n_bytes; host may be reused once it returns. */
KERNEL_BACKEND(void, from_host, (void *dst, const void *host, size_t n_bytes), (dst, host, n_bytes))

/* ---- status ---- */
/* 0, or -1 with the backend's pending failure as a one-line message in err: a failure of a call
 * made before on ctx that the entry itself could not report (the kernels return nothing; a GPU
 * reports a fault asynchronously). Waits for nothing. The CPU's is always 0; the runtime asks
 * once per training step, after the step's compute, and stops the run with the message. */
KERNEL_BACKEND(int, status, (char *err, size_t err_size), (err, err_size))

/* ---- embedding ---- */
/* out[bt, :] = wte[tokens[bt], :]. out (BT, C), tokens (BT) in [0, Vp), wte (Vp, C). */
KERNEL_OP(void, encoder_forward, (real *out, const int *tokens, const real *wte, int BT, int C),
          (out, tokens, wte, BT, C))
/* dwte[tokens[bt], :] += dout[bt, :]. */
KERNEL_OP(void, encoder_backward, (real *dwte, const real *dout, const int *tokens, int BT, int C),
          (dwte, dout, tokens, BT, C))
/* A vocabulary shard: wte (Vl, C) holds rows [v0, v0 + Vl) of the table. out[bt, :] = that
 * row for tokens inside the shard, 0 for the others (partial sums over the shards). */
KERNEL_OP(void, encoder_forward_shard,
          (real *out, const int *tokens, const real *wte, int v0, int Vl, int BT, int C),
          (out, tokens, wte, v0, Vl, BT, C))
/* dwte[tokens[bt] − v0, :] += dout[bt, :] for tokens inside the shard. */
KERNEL_OP(void, encoder_backward_shard,
          (real *dwte, const real *dout, const int *tokens, int v0, int Vl, int BT, int C),
          (dwte, dout, tokens, v0, Vl, BT, C))

/* ---- RMSNorm ---- */
/* out = inp · rsqrt(mean(inp²) + eps) · weight, per row. out (BT, C), rstd (BT) saved,
 * inp (BT, C), weight (C). out may equal inp. */
KERNEL_OP(void, rmsnorm_forward,
          (real *out, real *rstd, const real *inp, const real *weight, int BT, int C, real eps),
          (out, rstd, inp, weight, BT, C, eps))
/* dinp (BT, C) assigned, dweight (C) accumulated. dinp may equal dout. */
KERNEL_OP(void, rmsnorm_backward,
          (real *dinp, real *dweight, const real *dout, const real *inp, const real *weight,
           const real *rstd, int BT, int C),
          (dinp, dweight, dout, inp, weight, rstd, BT, C))

/* ---- linear (no bias) ---- */
/* out (BT, OC) = inp (BT, IC) · weightᵀ, weight (OC, IC). */
KERNEL_OP(void, linear_forward, (real *out, const real *inp, const real *weight, int BT, int IC, int OC),
          (out, inp, weight, BT, IC, OC))
/* dinp (BT, IC) = dout · weight, assigned, skipped when dinp is NULL;
 * dweight (OC, IC) += doutᵀ · inp, skipped when dweight is NULL (a split backward's B: the same
 * two products, each alone, as the whole call's). */
KERNEL_OP(void, linear_backward,
          (real *dinp, real *dweight, const real *dout, const real *inp, const real *weight, int BT,
           int IC, int OC),
          (dinp, dweight, dout, inp, weight, BT, IC, OC))
/* out (BT, OC) += inp · weightᵀ: a residual add folded into the product (beta = 1). */
KERNEL_OP(void, linear_forward_acc,
          (real *out, const real *inp, const real *weight, int BT, int IC, int OC),
          (out, inp, weight, BT, IC, OC))

/* ---- bf16 compute (precision.compute = "bf16": docs/design.md, "Kernels and backends") ----
 * The linears' products take bf16 operands and accumulate and write in fp32 (the attention's
 * products too where the backend has attention_*_bf16, below); everything else (norms, softmax,
 * SwiGLU's math, AdamW, the residual stream, gradients) stays in real (fp32).
 * The bf16 operands are written once, by the kernel that produces the tensor (the _bf16
 * variants below write what their fp32 twin would have written, rounded to nearest even), and
 * read by every product that uses it. NULL in a table without bf16 (the float64 build). */
/* dst[i] = bf16 of src[i] (a gradient operand, once after its producer). */
KERNEL_OP_BF16(void, round_bf16, (bf16 *dst, const real *src, size_t n_elems), (dst, src, n_elems))
/* dst[i] = src[i] widened to real (exact): a norm's gain read from its bf16 copy (the bf16 mode
 * reads no fp32 weight: where the fp32 master is sharded a rank has no whole one). */
KERNEL_OP_BF16(void, widen_bf16, (real *dst, const bf16 *src, size_t n_elems), (dst, src, n_elems))
/* acc[i] = bf16 of (acc[i] + x[i]), the sum in fp32 (exact: two bf16 values), rounded to
 * nearest even once: precision.grads = "bf16" adds a reduce-scatter's share into the gradient
 * shard this way (runtime/parallel/dp_passes.c). */
KERNEL_OP_BF16(void, accumulate_bf16, (bf16 *acc, const bf16 *x, size_t n_elems), (acc, x, n_elems))
/* encoder_forward_shard on the embedding's bf16 copy: out[bt, :] = wte[tokens[bt] − v0, :]
 * widened, zeros for tokens outside the Vl rows (v0 = 0, Vl = Vp: the whole table). */
KERNEL_OP_BF16(void, encoder_forward_bf16,
               (real *out, const int *tokens, const bf16 *wte, int v0, int Vl, int BT, int C),
               (out, tokens, wte, v0, Vl, BT, C))
/* out (BT, OC) = inp · weightᵀ with bf16 operands; 0, or nonzero with a message in err. */
KERNEL_OP_BF16(int, linear_forward_bf16,
               (real *out, const bf16 *inp, const bf16 *weight, int BT, int IC, int OC, char *err,
                size_t err_size),
               (out, inp, weight, BT, IC, OC, err, err_size))
/* out += inp · weightᵀ with bf16 operands (as linear_forward_acc). */
KERNEL_OP_BF16(int, linear_forward_acc_bf16,
               (real *out, const bf16 *inp, const bf16 *weight, int BT, int IC, int OC, char *err,
                size_t err_size),
               (out, inp, weight, BT, IC, OC, err, err_size))
/* dinp (BT, IC) = dout · weight, assigned, skipped when dinp is NULL; dweight (OC, IC) +=
 * doutᵀ · inp (accumulated in fp32), skipped when dweight is NULL. 0, or nonzero with a message
 * in err. */
KERNEL_OP_BF16(int, linear_backward_bf16,
               (real *dinp, real *dweight, const bf16 *dout, const bf16 *inp, const bf16 *weight,
                int BT, int IC, int OC, char *err, size_t err_size),
               (dinp, dweight, dout, inp, weight, BT, IC, OC, err, err_size))
/* rmsnorm_forward writing its output in bf16 only (rstd in real). */
KERNEL_OP_BF16(void, rmsnorm_forward_bf16,
               (bf16 *out, real *rstd, const real *inp, const real *weight, int BT, int C, real eps),
               (out, rstd, inp, weight, BT, C, eps))
/* swiglu_forward writing its output in bf16 only. */
KERNEL_OP_BF16(void, swiglu_forward_bf16,
               (bf16 *out, const real *gate, const real *up, size_t n_elems), (out, gate, up, n_elems))
/* swiglu_forward_rows writing its output in bf16 only. */
KERNEL_OP_BF16(void, swiglu_forward_rows_bf16, (bf16 *out, const real *gu, int rows, int F),
               (out, gu, rows, F))
/* adamw_update (the same param, m and v bits) that also writes param_bf16 = bf16 of the new
 * param: the compute copy the next forward reads. */
KERNEL_OP_BF16(void, adamw_update_bf16,
               (real *param, bf16 *param_bf16, const real *grad, real *m, real *v, size_t n_elems,
                double lr, double beta1, double beta2, double eps, double weight_decay, int t,
                real grad_scale),
               (param, param_bf16, grad, m, v, n_elems, lr, beta1, beta2, eps, weight_decay, t,
                grad_scale))

/* ---- rotary position embedding (rotate-half form, as Hugging Face Llama) ---- */
/* cos_table, sin_table (T, HS/2): cos and sin of the angle (pos0 + t) · theta^(−2i/HS),
 * computed in double. pos0 is the position of row 0, for ranks that hold a later slice of
 * the sequence. HS even. */
KERNEL_OP(void, rope_table, (real *cos_table, real *sin_table, int T, int HS, double theta, int pos0),
          (cos_table, sin_table, T, HS, theta, pos0))
/* Rotates each head vector in pairs (i, i + HS/2):
 *   out[i]        = inp[i] cos_i − inp[i + HS/2] sin_i
 *   out[i + HS/2] = inp[i + HS/2] cos_i + inp[i] sin_i
 * inp, out (B, T, NHx, HS) with NHx = NH for q, NKV for k. out may equal inp. */
KERNEL_OP(void, rope_forward,
          (real *out, const real *inp, const real *cos_table, const real *sin_table, int B, int T,
           int NHx, int HS),
          (out, inp, cos_table, sin_table, B, T, NHx, HS))
/* The transposed rotation. dinp may equal dout. */
KERNEL_OP(void, rope_backward,
          (real *dinp, const real *dout, const real *cos_table, const real *sin_table, int B, int T,
           int NHx, int HS),
          (dinp, dout, cos_table, sin_table, B, T, NHx, HS))
/* The same, in place, on the fused q|k|v product (one linear over the three weights stored
 * one after the other): qkv (B, T, (NH + 2·NKV)·HS) rows of [q | k | v]; q's NH heads and k's
 * NKV heads are rotated, v is left as it is. */
KERNEL_OP(void, rope_forward_qkv,
          (real *qkv, const real *cos_table, const real *sin_table, int B, int T, int NH, int NKV,
           int HS),
          (qkv, cos_table, sin_table, B, T, NH, NKV, HS))
KERNEL_OP(void, rope_backward_qkv,
          (real *dqkv, const real *cos_table, const real *sin_table, int B, int T, int NH, int NKV,
           int HS),
          (dqkv, cos_table, sin_table, B, T, NH, NKV, HS))

/* ---- causal self-attention with grouped KV heads ---- */
/* Flash-style: no (T, T) matrix is kept. Layouts: out and dout (B, T, NH·HS), q (B, T, NH, HS),
 * k and v (B, T, NKV, HS); query head h reads KV head h / (NH / NKV); causal. lse (B, NH, T):
 * each query row's natural-log log-sum-exp of its scaled scores s_ij = q_i·k_j / sqrt(HS),
 * j ≤ i (before dropout). Dropout (drop, ops.h: struct attention_dropout; NULL or p == 0 for
 * none) is drawn from Philox inside the kernels, forward and backward alike.
 * scratch: attention_scratch_n_elems elements of the backend's memory, with no T·T term (a size
 * only, no work, independent of the thread count). The runtime sizes its workspace with it. */
KERNEL_OP(size_t, attention_scratch_n_elems, (int B, int T, int NH, int NKV, int HS), (B, T, NH, NKV, HS))
/* out = softmax(scores) ⊙ M · v in key blocks with an online softmax; lse written. */
KERNEL_OP(void, attention_forward,
          (real *out, real *lse, real *scratch, const real *q, const real *k, const real *v,
           const struct attention_dropout *drop, int B, int T, int NH, int NKV, int HS),
          (out, lse, scratch, q, k, v, drop, B, T, NH, NKV, HS))
/* dq (B, T, NH, HS), dk and dv (B, T, NKV, HS), all assigned, recomputing the scores block by
 * block: P_ij = exp(s_ij − lse_i), D_i = Σ_d dout_i,d · out_i,d (out: the forward's output as
 * saved), dP_ij = (dout_i · v_j) · M_ij, dS_ij = P_ij (dP_ij − D_i), dq_i = Σ_j dS_ij k_j /
 * sqrt(HS), dk_j = Σ_i dS_ij q_i / sqrt(HS), dv_j = Σ_i P_ij M_ij dout_i, where M_ij is 0 or
 * 1/(1 − p) (1 without dropout). */
KERNEL_OP(void, attention_backward,
          (real *dq, real *dk, real *dv, real *scratch, const real *dout, const real *q,
           const real *k, const real *v, const real *out, const real *lse,
           const struct attention_dropout *drop, int B, int T, int NH, int NKV, int HS),
          (dq, dk, dv, scratch, dout, q, k, v, out, lse, drop, B, T, NH, NKV, HS))
/* Both on the fused layout: q, k and v read from qkv's rows [q | k | v] (as rope_forward_qkv),
 * dq, dk and dv written (assigned) into dqkv's rows in the same layout; out and dout as above.
 * The same products and sums as the separate entries, so the same bits. */
KERNEL_OP(void, attention_forward_qkv,
          (real *out, real *lse, real *scratch, const real *qkv, const struct attention_dropout *drop,
           int B, int T, int NH, int NKV, int HS),
          (out, lse, scratch, qkv, drop, B, T, NH, NKV, HS))
KERNEL_OP(void, attention_backward_qkv,
          (real *dqkv, real *scratch, const real *dout, const real *qkv, const real *out,
           const real *lse, const struct attention_dropout *drop, int B, int T, int NH, int NKV, int HS),
          (dqkv, scratch, dout, qkv, out, lse, drop, B, T, NH, NKV, HS))
/* The four above for the bf16 mode: the same walk, softmax and sums, each product's operands
 * rounded to bf16 (nearest even) and accumulated in fp32; scratch of
 * attention_scratch_n_elems_bf16 elements. Where a backend has none (NULL), the bf16 mode's
 * attention runs the fp32 entries. */
KERNEL_OP_BF16_OPT(size_t, attention_scratch_n_elems_bf16, (int B, int T, int NH, int NKV, int HS),
                   (B, T, NH, NKV, HS))
KERNEL_OP_BF16_OPT(void, attention_forward_bf16,
                   (real *out, real *lse, real *scratch, const real *q, const real *k, const real *v,
                    const struct attention_dropout *drop, int B, int T, int NH, int NKV, int HS),
                   (out, lse, scratch, q, k, v, drop, B, T, NH, NKV, HS))
KERNEL_OP_BF16_OPT(void, attention_backward_bf16,
                   (real *dq, real *dk, real *dv, real *scratch, const real *dout, const real *q,
                    const real *k, const real *v, const real *out, const real *lse,
                    const struct attention_dropout *drop, int B, int T, int NH, int NKV, int HS),
                   (dq, dk, dv, scratch, dout, q, k, v, out, lse, drop, B, T, NH, NKV, HS))
KERNEL_OP_BF16_OPT(void, attention_forward_qkv_bf16,
                   (real *out, real *lse, real *scratch, const real *qkv,
                    const struct attention_dropout *drop, int B, int T, int NH, int NKV, int HS),
                   (out, lse, scratch, qkv, drop, B, T, NH, NKV, HS))
KERNEL_OP_BF16_OPT(void, attention_backward_qkv_bf16,
                   (real *dqkv, real *scratch, const real *dout, const real *qkv, const real *out,
                    const real *lse, const struct attention_dropout *drop, int B, int T, int NH,
                    int NKV, int HS),
                   (dqkv, scratch, dout, qkv, out, lse, drop, B, T, NH, NKV, HS))

/* ---- context parallelism's ring attention: its blocks (host/runtime/parallel/cp.h) ----
 * A block (blk, host memory: struct attention_block, ops.h) is query rows at global positions
 * against keys at global positions; layouts as attention_forward's with q, out, dout, dq
 * (B, q_rows, NH·HS), k, v, dk, dv (B, kv_rows, NKV·HS), lse and D (B, NH, q_rows), each pointer
 * at the block's first row. Causal and dropout by global position, so a ring of blocks computes
 * the whole-sequence kernels' draws and products; only the order of the sums differs.
 * scratch: attention_cp_scratch_n_elems elements (a size only) for any block of at most Tq rows
 * against Tk keys. */
KERNEL_OP(size_t, attention_cp_scratch_n_elems, (int B, int Tq, int Tk, int NH, int NKV, int HS),
          (B, Tq, Tk, NH, NKV, HS))
/* out, lse (rows 0 .. Tq − 1) assigned: the block's partial, out softmax-normalised over the
 * block's keys at or before each row, lse their log-sum-exp (a row with none: out 0, lse −∞).
 * A caller skips a block whose keys all lie after its rows. */
KERNEL_OP(void, attention_cp_forward,
          (real *out, real *lse, real *scratch, const real *q, const real *k, const real *v,
           const struct attention_dropout *drop, const struct attention_block *blk, int B, int NH,
           int NKV, int HS),
          (out, lse, scratch, q, k, v, drop, blk, B, NH, NKV, HS))
/* (out, lse) ← their log-sum-exp merge with the partial (out_b, lse_b), Tq rows, both laid out
 * with q_rows: m = max(la, lb), out = (e^(la − m)·out + e^(lb − m)·out_b) / (e^(la − m) +
 * e^(lb − m)), lse = m + log of that sum, in double, rounded once; both −∞: left as is. */
KERNEL_OP(void, attention_cp_merge,
          (real *out, real *lse, const real *out_b, const real *lse_b, int B, int Tq, int q_rows,
           int NH, int HS),
          (out, lse, out_b, lse_b, B, Tq, q_rows, NH, HS))
/* D (B, NH, q_rows) rows 0 .. Tq − 1 = Σ_d dout · out per row (the final, merged out), in
 * double, rounded once: once per row for every block. */
KERNEL_OP(void, attention_cp_row_dots,
          (real *D, const real *dout, const real *out, int B, int Tq, int q_rows, int NH, int HS),
          (D, dout, out, B, Tq, q_rows, NH, HS))
/* dq (the block's rows) += its share, dk and dv (the block's keys) += theirs (the formulas of
 * attention_backward, with lse the rows' final log-sum-exp over the whole sequence and D their
 * attention_cp_row_dots). */
KERNEL_OP(void, attention_cp_backward,
          (real *dq, real *dk, real *dv, real *scratch, const real *dout, const real *q,
           const real *k, const real *v, const real *lse, const real *D,
           const struct attention_dropout *drop, const struct attention_block *blk, int B, int NH,
           int NKV, int HS),
          (dq, dk, dv, scratch, dout, q, k, v, lse, D, drop, blk, B, NH, NKV, HS))

/* ---- SwiGLU ---- */
/* out = silu(gate) ⊙ up, silu(x) = x · sigmoid(x). All n_elems (BT · F). */
KERNEL_OP(void, swiglu_forward, (real *out, const real *gate, const real *up, size_t n_elems),
          (out, gate, up, n_elems))
/* dgate, dup assigned. In place too: dgate may be gate and dup may be up (each element's inputs
 * are read before its outputs are written). */
KERNEL_OP(void, swiglu_backward,
          (real *dgate, real *dup, const real *dout, const real *gate, const real *up,
           size_t n_elems),
          (dgate, dup, dout, gate, up, n_elems))
/* The same on the fused gate|up product: gu (rows, 2F) holds [gate | up] per row (one linear
 * over the two weights stored one after the other), out (rows, F). */
KERNEL_OP(void, swiglu_forward_rows, (real *out, const real *gu, int rows, int F), (out, gu, rows, F))
/* dgu (rows, 2F) = [dgate | dup] per row, assigned; dout (rows, F). */
KERNEL_OP(void, swiglu_backward_rows, (real *dgu, const real *dout, const real *gu, int rows, int F),
          (dgu, dout, gu, rows, F))

/* ---- mixture of experts (docs/moe.md) ----
 * N tokens in G groups of T consecutive tokens (a group is one sequence: N = G·T); E experts,
 * K = top_k. A token's k-th choice is an "assignment". The kept assignments are the rows of
 * the dispatched buffer xe (R, ·), expert-major: expert e's rows are [off_e, off_e + counts[e])
 * with off_e = Σ_{e' < e} counts[e'], and within an expert in token order (n ascending; a token
 * reaches one expert at most once). slot (N, K), int: the row of assignment (n, k) in xe, or −1
 * when it is dropped. int buffers are the backend's memory, as the tokens are. */
/* probs (N, E) = softmax of each row of logits; topi (N, K) = the K experts of largest
 * probability, in decreasing order (ties: the lower expert index first); topw (N, K) = probs at
 * topi divided by their sum (Hugging Face Mixtral's renormalised weights); lse (N) =
 * logsumexp of each row of logits (the z-loss's input). K ≤ E. */
KERNEL_OP(void, moe_router_forward,
          (real *probs, int *topi, real *topw, real *lse, const real *logits, int N, int E, int K),
          (probs, topi, topw, lse, logits, N, E, K))
/* Routing: routed (E) = assignments per expert before dropping; counts (E) = those kept;
 * slot (N, K) as above. capacity 0 keeps every assignment; else each group keeps at most
 * `capacity` assignments per expert, taken in priority order: the group's first choices in
 * token order, then its second choices in token order, ... (GShard's order); the rest drop.
 * All assigned. */
KERNEL_OP(void, moe_route,
          (int *slot, int *counts, int *routed, const int *topi, int N, int T, int E, int K,
           int capacity),
          (slot, counts, routed, topi, N, T, E, K, capacity))
/* xe[slot[n, k]] = x[n] (C wide) for every kept assignment; other rows untouched. */
KERNEL_OP(void, moe_dispatch, (real *xe, const real *x, const int *slot, int N, int K, int C),
          (xe, x, slot, N, K, C))
/* dx (N, C) = Σ over kept k, k ascending, of dxe[slot[n, k]]; 0 for a token with none kept.
 * Assigned. */
KERNEL_OP(void, moe_dispatch_backward, (real *dx, const real *dxe, const int *slot, int N, int K, int C),
          (dx, dxe, slot, N, K, C))
/* out (N, C) = Σ over kept k, k ascending, of topw[n, k] · ye[slot[n, k]]; 0 for a token with
 * none kept (a dropped token passes through the residual only). Assigned. */
KERNEL_OP(void, moe_combine,
          (real *out, const real *ye, const int *slot, const real *topw, int N, int K, int C),
          (out, ye, slot, topw, N, K, C))
/* The dual of moe_combine: dye[slot[n, k]] = topw[n, k] · dout[n] (rows of kept assignments;
 * others untouched); dtopw[n, k] = dout[n] · ye[slot[n, k]], 0 when dropped. Assigned. */
KERNEL_OP(void, moe_combine_backward,
          (real *dye, real *dtopw, const real *dout, const real *ye, const int *slot,
           const real *topw, int N, int K, int C),
          (dye, dtopw, dout, ye, slot, topw, N, K, C))
/* The load-balancing loss of each group g (tokens [g·T, (g + 1)·T)), the Switch Transformer
 * / Mixtral form: aux[g] = E · Σ_e f_e · P_e, f_e = (1/T) Σ_n Σ_k [topi[n, k] = e] (before
 * any drop), P_e = (1/T) Σ_n probs[n, e]. aux (G = N/T) assigned. A balanced router gives K. */
KERNEL_OP(void, moe_aux_loss,
          (real *aux, const real *probs, const int *topi, int N, int T, int E, int K),
          (aux, probs, topi, N, T, E, K))
/* dlogits (N, E), assigned: d/dlogits of
 *   Σ_{n,k} dtopw[n, k] · topw[n, k] + aux_scale · Σ_g aux[g] + z_scale · Σ_n lse[n]²
 * through the renormalisation and the softmax, with the counts f_e held constant (they are
 * not differentiable). */
KERNEL_OP(void, moe_router_backward,
          (real *dlogits, const real *dtopw, const real *probs, const int *topi, const real *topw,
           const real *lse, int N, int T, int E, int K, real aux_scale, real z_scale),
          (dlogits, dtopw, probs, topi, topw, lse, N, T, E, K, aux_scale, z_scale))

/* ---- dropout ---- */
/* mask[i] = 0 with probability p, else 1/(1 − p), decided by
 * philox_uniform(seed, c1, c2, c3, first_elem + i) < p (philox.h), a comparison of floats in
 * both builds, so the float64 build drops the same elements. A rank that holds elements
 * [a, b) of a tensor passes first_elem = a and gets the serial run's values. */
KERNEL_OP(void, dropout_mask,
          (real *mask, size_t n_elems, float p, uint64_t seed, uint32_t c1, uint32_t c2,
           uint32_t c3, uint64_t first_elem),
          (mask, n_elems, p, seed, c1, c2, c3, first_elem))
/* out = inp ⊙ mask. out may equal inp. */
KERNEL_OP(void, dropout_forward, (real *out, const real *inp, const real *mask, size_t n_elems),
          (out, inp, mask, n_elems))
/* dinp = dout ⊙ mask, assigned. dinp may equal dout. */
KERNEL_OP(void, dropout_backward, (real *dinp, const real *dout, const real *mask, size_t n_elems),
          (dinp, dout, mask, n_elems))

/* ---- element-wise sum ---- */
/* out = a + b, n_elems each. out may equal a or b, so it is also "accumulate" (a += b): the
 * residual adds, gradients summed over branches, shards or micro-batches. */
KERNEL_OP(void, vec_add, (real *out, const real *a, const real *b, size_t n_elems), (out, a, b, n_elems))

/* ---- cross-entropy over the vocabulary ---- */
/* Softmax over the first V columns of each row of logits (BT, Vp); padding columns get
 * probability 0. losses (BT): −log probs[bt, targets[bt]], or 0 where targets[bt] == −1.
 * probs (BT, Vp) is saved for backward and may equal logits (computed in place). */
KERNEL_OP(void, crossentropy_forward,
          (real *losses, real *probs, const real *logits, const int *targets, int BT, int V, int Vp),
          (losses, probs, logits, targets, BT, V, Vp))
/* dlogits = (probs − onehot(target)) · dloss_scale, assigned; 0 in padding columns and in
 * rows whose target is −1. dloss_scale is d(total loss)/d(losses[bt]), the same for every
 * token (e.g. 1 / number of counted tokens). dlogits may equal probs. */
KERNEL_OP(void, crossentropy_backward,
          (real *dlogits, const real *probs, const int *targets, real dloss_scale, int BT, int V,
           int Vp),
          (dlogits, probs, targets, dloss_scale, BT, V, Vp))
/* Cross-entropy over a vocabulary split in column shards (the vocabulary-parallel loss):
 * logits (BT, Vl) hold columns [v0, v0 + Vl) of the padded vocabulary, of which the first
 * Vvalid = clamp(V − v0, 0, Vl) are real tokens. The caller reduces over the shards between
 * the calls: stats (3, BT) = [max | Σ exp | target logit].
 * 1. shard_max: stats[0] = the shard's max (−inf when it has no real token); reduce with max.
 * 2. shard_sums: stats[1] = Σ exp(logit − max) over the shard, stats[2] = the target's logit
 *    when the target is in the shard, else 0; reduce both with sum.
 * 3. shard_finish: losses (as crossentropy_forward) and probs = exp(logit − max) / Σ (0 in
 *    padding columns); probs may equal logits. */
KERNEL_OP(void, crossentropy_shard_max, (real *stats, const real *logits, int BT, int Vvalid, int Vl),
          (stats, logits, BT, Vvalid, Vl))
KERNEL_OP(void, crossentropy_shard_sums,
          (real *stats, const real *logits, const int *targets, int v0, int BT, int Vvalid, int Vl),
          (stats, logits, targets, v0, BT, Vvalid, Vl))
KERNEL_OP(void, crossentropy_shard_finish,
          (real *losses, real *probs, const real *logits, const real *stats, const int *targets,
           int BT, int Vvalid, int Vl),
          (losses, probs, logits, stats, targets, BT, Vvalid, Vl))
/* dlogits = (probs − onehot(target − v0)) · dloss_scale on the shard, as
 * crossentropy_backward. dlogits may equal probs. */
KERNEL_OP(void, crossentropy_shard_backward,
          (real *dlogits, const real *probs, const int *targets, int v0, real dloss_scale, int BT,
           int Vvalid, int Vl),
          (dlogits, probs, targets, v0, dloss_scale, BT, Vvalid, Vl))

/* ---- optimizer and gradient utilities ---- */
/* One step of torch.optim.AdamW (defaults: no amsgrad, no maximize) on n_elems elements of
 * param, with grad and the moments m, v; t the 1-based step; grad read as g = grad · grad_scale
 * (rounded to real: gradient clipping's scale, 1 when not clipping; grad itself unchanged):
 *   param ← param · (1 − lr·weight_decay)                       (decoupled, applied first)
 *   m ← β1·m + (1 − β1)·g;   v ← β2·v + (1 − β2)·g²
 *   param ← param − lr/(1 − β1^t) · m / (sqrt(v)/sqrt(1 − β2^t) + eps)
 * The settings are double, as torch's Python floats are (1 − β2 taken from a float 0.999f is
 * off by 1e-5), and so are the bias corrections. */
KERNEL_OP(void, adamw_update,
          (real *param, const real *grad, real *m, real *v, size_t n_elems, double lr, double beta1,
           double beta2, double eps, double weight_decay, int t, real grad_scale),
          (param, grad, m, v, n_elems, lr, beta1, beta2, eps, weight_decay, t, grad_scale))
/* Σ x² over n_elems, accumulated in double (for the global gradient norm), returned to the
 * host; the same bits for any number of threads. */
KERNEL_OP(double, sumsq, (const real *x, size_t n_elems), (x, n_elems))

#undef KERNEL_OP
#undef KERNEL_OP_BF16
#undef KERNEL_OP_BF16_OPT
#undef KERNEL_BACKEND
