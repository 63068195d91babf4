/* The usage text (usage.h): `tycho --help` and `tycho COMMAND --help`. Each command's section is
 * written once, and the whole text is made of the sections in order, so the two cannot differ. */
#include "usage.h"

#include <stdio.h>
#include <string.h>

static const char head[] =
  "usage: tycho <command> [arguments]\n"
  "\n"
  "commands:\n";

/* Each command's lines, in the order `tycho --help` lists them (repl has three forms). */
static const struct {
  const char *command, *text;
} sections[] = {
  { "check",
    "  check PLAN.lua [--world N] [--json] [--cluster C.lua [--sbatch [--cpus-per-task N]]]\n"
    "        [--svg FILE] [--set path=value ...]\n"
    "        compile and validate a plan and print what it does: mesh and groups, stages,\n"
    "        per-module tensor-parallel splits and the collectives they insert, recompute,\n"
    "        schedule, the memory bill per rank (each category's peak, and the model states kept\n"
    "        between steps apart from the transient buffers), the traffic of a step, batch\n"
    "        arithmetic, seeds, and the runtime the byte figures describe: this build's CPU\n"
    "        runtime, or for a plan with device = \"cuda\" the GPU runtime's element sizes\n"
    "        (--set device=cpu|cuda)\n"
    "        --world N   ranks in the job, 1..16777216 (needed when mesh.dp is \"auto\")\n"
    "        --json      one JSON document on stdout (schema: docs/check-json.md)\n"
    "        --cluster C.lua  price the plan on a cluster (plans/clusters/): headroom of the\n"
    "                    memory bill, predicted step time and MFU\n"
    "        --sbatch    instead, a Slurm batch script for the plan on that cluster: nodes, tasks\n"
    "                    and GPUs per node from the cluster file and the world, the srun line\n"
    "                    running tycho run of the same plan and --sets, the checkpoint and\n"
    "                    metrics paths, the memory and step-time summary as comments\n"
    "        --cpus-per-task N  the script's CPUs per rank, 1..4096 (default: 1 on a CPU\n"
    "                    cluster; on a GPU one whole nodes, their CPUs shared out by srun)\n"
    "        --svg FILE  also draw the step as one SVG picture (written whole, or not at all):\n"
    "                    a lane per pipeline rank with each micro-batch's forward, backward and\n"
    "                    recompute where the schedule simulator puts them, the bubble shaded, and\n"
    "                    each pipeline rank's memory bill against the device memory (--cluster);\n"
    "                    a link, a folder or a missing folder at FILE is refused (exit 2)\n" },
  { "tune",
    "  tune PLAN.lua --world N --cluster C.lua [--top K] [--headroom PCT] [--out FILE]\n"
    "        rank the layouts of the plan's model for N ranks of the cluster by predicted step\n"
    "        time among those whose memory bill fits with PCT% spare (0..99, default 10), print\n"
    "        the K best (1..1000, default 5) and write the best as a plan file (default\n"
    "        PLAN_tuned_N.lua): the layout over the plan and every --set given, the plan\n"
    "        loaded by require where a module name finds it from that file's folder, else\n"
    "        its text written in\n" },
  { "run",
    "  run PLAN.lua [--set path=value ...] [--listen ADDR [--listen-public]]\n"
    "        compile the plan and train with it (under mpirun or srun for more ranks: data,\n"
    "        tensor and pipeline parallelism, ZeRO 1-3, recompute) on the CPU runtime, or with\n"
    "        device = \"cuda\" on a CUDA device (a build with the CUDA backend: device local\n"
    "        rank % devices, ranks exchanging through NCCL where each has its own GPU, else\n"
    "        through host staging, plan field comm; refused with exit 2 naming why); \"auto\"\n"
    "        (the default) is CUDA where the build has it and a device is visible, else the CPU;\n"
    "        the header says which. In fp32 or, with precision.compute = \"bf16\", the\n"
    "        linears' products in bf16 (one TP rank, ZeRO 0-2), and on the CPU the\n"
    "        attention's too\n"
    "        --listen ADDR  serve `tycho repl --attach ADDR` between steps: ADDR a Unix socket\n"
    "                    path (created 0600) or HOST:PORT; a token file only you can read is\n"
    "                    written next to it (ADDR.token, or tycho-listen-PORT.token); nothing\n"
    "                    listens without it (a one-rank run opens no TCP port). docs/repl.md\n"
    "        --listen-public  let --listen's HOST be other than loopback (e.g. 0.0.0.0), which\n"
    "                    other machines can reach: refused without it (exit 2), warned with it\n" },
  { "repl",
    "  repl [PLAN.lua [FILE.lua]] [--set path=value ...] [--timeout S]\n"
    "        an SPMD Lua prompt on every rank of the job (mpirun -np N tycho repl ...): rank 0\n"
    "        reads, every rank runs; PLAN.lua is opened as the trainer t; FILE.lua (or stdin that\n"
    "        is not a terminal) runs chunk by chunk, exit 1 if one failed; @0, @2-3, @dp=0 or\n"
    "        @tp=1,pp=0 before a chunk runs it on those ranks only; --timeout S: the comm\n"
    "        watchdog's seconds during the session (1..604800, default 30). docs/repl.md\n"
    "        At the prompt, help() lists the REPL's commands and the trainer's fields and methods\n" },
  { "repl",
    "  repl [PLAN.lua [FILE.lua]] -n N [--launcher CMD] [--set path=value ...] [--timeout S]\n"
    "        the same prompt at this terminal, the job's N ranks (1..65536, also --ranks N)\n"
    "        started here with CMD as for rehearse: each chunk's output shown as it comes,\n"
    "        Ctrl-C stops a chunk at the next step boundary on every rank (twice within 2 s\n"
    "        ends the job), Ctrl-D or quit() ends every rank\n" },
  { "repl",
    "  repl --attach ADDR [FILE.lua] [--token FILE]\n"
    "        the same prompt on a running `tycho run --listen ADDR`, t its trainer: chunks run\n"
    "        between its steps; t:pause(), t:resume(); detach(), quit() or Ctrl-D leave it\n"
    "        training. The token is read from the file --listen wrote (ADDR.token)\n" },
  { "rehearse",
    "  rehearse PLAN.lua [--world N] [--steps K] [--launcher CMD] [--fault path=value ...]\n"
    "        run the plan's exact layout (mesh, stages, splits, sequence parallelism,\n"
    "        recompute, ZeRO, schedule) at toy scale on CPU ranks: the model shrunk (layers,\n"
    "        heads and every divisibility kept), K steps (1..64, default 3) on the addition\n"
    "        corpus, against the serial run of the same shrunk model; prints the worst relative\n"
    "        difference, whether each rank's collectives equal check's traffic and its memory\n"
    "        peaks check's bill; exit 1 when any fails. The ranks start with CMD, {n} their\n"
    "        count (default with Open MPI 'mpirun --oversubscribe -np {n}', run as root with\n"
    "        --allow-run-as-root too). docs/rehearse.md\n"
    "        --head-dim D, --seq S, --micro-batches M  the shrunk head size (default 4), sequence\n"
    "                    (default 32) and micro-batches per step per rank (default at most\n"
    "                    max(4, 2·pp·virtual_stages))\n"
    "        --fault path=value  an override for the layout's run only, to see a rehearsal fail\n" },
  { "calibrate",
    "  calibrate [PLAN.lua] --out FILE [--set path=value ...] [--reps N] [--name TEXT]\n"
    "            [--launcher CMD]\n"
    "        on one rank per core (started with CMD as for rehearse, or under mpirun): measure\n"
    "        this machine at PLAN's shapes (default plans/tiny.lua) - sgemm peak, the plan's\n"
    "        linears, attention, pointwise work, the optimizer, the collectives' latency and\n"
    "        bandwidth, cores, memory - and write a cluster file for check --cluster and tune\n"
    "        (a device = one core running one rank of one thread); --reps N: repetitions per\n"
    "        measurement, 1..1000 (default 10). docs/calibrate.md\n" },
  { "generate",
    "  generate PLAN.lua|HF_FOLDER (--prompt-ids I,J,K | --prompt TEXT) [--max-tokens N]\n"
    "           [--temperature T] [--top-k K] [--top-p P] [--seed S] [--tokenizer PATH]\n"
    "           [--json] [--set ...]\n"
    "        continue a prompt on one rank on the CPU (fp32; a bf16 plan's fp32 master weights)\n"
    "        with a key/value cache, printing each token as it comes (its text where there is a\n"
    "        tokenizer, the ids then on stderr; else its id): the weights of a Hugging Face\n"
    "        model folder, or a plan's as `run` starts from them (the newest checkpoint in\n"
    "        checkpoint.dir, else init.from, else seeds.model). Stops at the model's\n"
    "        eos_token_id (config.json, else the tokenizer's), after N tokens (1..1000000,\n"
    "        default 64), or when the sequence reaches model.max_seq. Dense models only\n"
    "        --prompt TEXT  encoded by the tokenizer (no BOS added): --tokenizer PATH (a\n"
    "                    tokenizer.json or its folder), else the model folder's or init.from's\n"
    "                    tokenizer.json; refused without one (exit 2)\n"
    "        --temperature T  0 (the default): greedy, the largest logit (the lowest id on\n"
    "                    ties); else softmax(logits / T) sampled, after --top-k K (0, the\n"
    "                    default: all) and --top-p P (the smallest most probable set whose\n"
    "                    probability reaches P; default 1: all), renormalised\n"
    "        --seed S    the draws' seed (default 0): the same seed, the same tokens\n"
    "        --json      one line {\"ids\": [...], \"text\": ...} at the end instead\n"
    "        --no-cache  recompute the whole sequence at every token (slow; checks the cache)\n" },
  { "tokenize",
    "  tokenize TOKENIZER FILE... --out OUT.bin [--no-eos] [--threads N]\n"
    "        encode text with a Hugging Face tokenizer.json (the file, or a model folder that\n"
    "        holds it) into an llm.c token file for data.train: the ids of the `tokenizers`\n"
    "        library's encode(text, add_special_tokens=False); byte-level and SentencePiece-style\n"
    "        BPE, anything else refused by name (exit 2). Each FILE is one document, or a .jsonl\n"
    "        file one document a line (its \"text\"), invalid UTF-8 read as U+FFFD; each\n"
    "        document followed by the tokenizer's eos id (--no-eos: not). Version 1 (uint16)\n"
    "        where every id is below 65536, else version 2 (uint32); written whole or not at all,\n"
    "        a link at OUT refused. --threads N: 1..256 (default: the CPUs it may run on). docs/plans.md\n" },
  { "ckpt",
    "  ckpt inspect|verify DIR\n"
    "        a checkpoint (checkpoint.dir/step_N, or checkpoint.dir for its newest): inspect\n"
    "        prints its step, model, mesh and files; verify also checks every piece's checksum\n"
    "        and that every tensor is covered exactly once (exit 1 when not)\n" },
};

/* After the commands in `tycho --help`. */
static const char general[] =
  "  --help, -h      this text\n"
  "  COMMAND --help  the usage of that command alone\n"
  "  --version       the version, what the kernels compute in (fp32, or float64 in the\n"
  "                  proof build: cmake -DTYCHO_FLOAT64=ON) and whether the build has the\n"
  "                  CUDA backend\n"
  "\n";

/* The options of the commands that compile a plan (check, tune, run, rehearse). */
static const char plan_options[] =
  "options for check, tune, run and rehearse:\n"
  "  --set path.to.field=value   override a plan field (numbers, true/false, nil, strings,\n"
  "                              comma lists, or a Lua table constructor {...}, e.g.\n"
  "                              'stages={{\"embed\",0,1},{2,3,\"head\"}}'); may repeat,\n"
  "                              applied in order\n"
  "  --unsafe                    lift the plan sandbox (io, package, no limits)\n"
  "  --max-memory MiB            the plan's Lua heap cap, 1..1048576 (default 256)\n"
  "  --max-instructions N        the plan's Lua instruction cap, 1000..10^15 (default 200000000)\n"
  "  numbers are decimal integers; one out of its range is refused (exit 2)\n"
  "\n";

static const char exit_codes[] = "exit codes: 0 ok, 1 runtime failure (the machine or a peer), 2 usage, plan or input error (bad content in a file given)\n";

#define N_SECTIONS (sizeof sections / sizeof sections[0])

const char *usage_text(void)
{
  static char text[16384];
  if (!text[0]) {
    size_t n = 0;
    n += (size_t)snprintf(text + n, sizeof text - n, "%s", head);
    for (size_t i = 0; i < N_SECTIONS && n < sizeof text; i++)
      n += (size_t)snprintf(text + n, sizeof text - n, "%s", sections[i].text);
    if (n < sizeof text)
      snprintf(text + n, sizeof text - n, "%s%s%s", general, plan_options, exit_codes);
  }
  return text;
}

int usage_print_command(FILE *f, const char *command)
{
  int found = 0;
  for (size_t i = 0; i < N_SECTIONS; i++)
    if (strcmp(sections[i].command, command) == 0) {
      fputs(found++ ? "" : "usage:\n", f);
      fputs(sections[i].text, f);
    }
  if (!found)
    return -1;
  fputs("\n", f);
  if (strcmp(command, "check") == 0 || strcmp(command, "tune") == 0 || strcmp(command, "run") == 0 ||
      strcmp(command, "rehearse") == 0)
    fputs(plan_options, f);
  fputs(exit_codes, f);
  return 0;
}

int usage_asked(int argc, char **argv)
{
  if (argc < 3)
    return 0;
  for (int i = 2; i < argc; i++) {
    if (strcmp(argv[i], "--help") == 0 || strcmp(argv[i], "-h") == 0)
      return 1;
    if (strcmp(argv[i], "--set") == 0 || strcmp(argv[i], "--launcher") == 0 || strcmp(argv[i], "--fault") == 0)
      i++; /* their values are not options */
  }
  return 0;
}
