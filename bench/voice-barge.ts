/**
 * The voice benchmark's barge-in phase side by side (`BENCH_VOICE_PHASES=barge-ab`, issue 41): a device
 * speaks over each reply (bench/voice-device.ts, mode `barge`) against `before` (a checkout named by
 * `BENCH_VOICE_BEFORE`: a directory, or a git revision checked out into a temporary worktree), `after`
 * (this checkout) and `after_audio_threads_0` (this checkout, PERCH_VOICE_AUDIO_THREADS=0), rounds
 * alternating between them. The figure of voice.md §7 "Interruptions" (within §2's 250 ms): the
 * interrupting speech's first voiced block handed to the device's stack → the reply's audio paused at
 * the device (its last audible block before a gap of more than 100 ms), p50/p95. Beside it, onset → the
 * reply's last packet (its `EOS … interrupted`, stamped by the server: voice.md §7's 1 s, judged on the
 * words so far since issue 50). `BENCH_VOICE_BARGE_ROUNDS` (3) rounds of `BENCH_VOICE_BARGE_TRIALS` (2)
 * interruptions per server; then `BENCH_VOICE_BARGE_FILLERS` (10) backchannels ("Mm-hmm.", nova) said
 * a second into a story's audio per server: how many the reply resumed after (§7: all of them).
 * `BENCH_VOICE_BARGE_THREADS0=0` leaves out the audio-threads-off server.
 */
import { mkdtempSync } from "node:fs";
import { join } from "node:path";
import { benchConfig, ROOT, round, type Server, startServer } from "./support.ts";
import { devices, pct } from "./voice.ts";
import type { BargeReport, FillerReport } from "./voice-device.ts";
import { beforeRoot, spokenFile } from "./voice-turns.ts";

const ROUNDS = Number(process.env.BENCH_VOICE_BARGE_ROUNDS ?? 3);
const TRIALS = Number(process.env.BENCH_VOICE_BARGE_TRIALS ?? 2);
const FILLERS = Number(process.env.BENCH_VOICE_BARGE_FILLERS ?? 10);
const THREADS0 = process.env.BENCH_VOICE_BARGE_THREADS0 !== "0";

export function bargeFigures(barge: BargeReport[]) {
  const of = (k: keyof BargeReport) => pct(barge.map((b) => b[k]).filter((x): x is number => typeof x === "number" && Number.isFinite(x)));
  return {
    trials: barge.length,
    interrupted: barge.filter((b) => b.interrupted).length,
    onset_to_reply_paused_at_device_ms: of("onset_to_reply_paused_ms"),
    reply_pause_gap_ms: of("reply_pause_gap_ms"),
    onset_to_last_reply_sample_ms: of("onset_to_silence_ms"),
    onset_to_last_reply_packet_ms: of("onset_to_last_packet_ms"),
  };
}

export async function bargeSideBySide(o: { dir: string; upstreamUrl: string; question: string }): Promise<unknown> {
  const spec = process.env.BENCH_VOICE_BEFORE;
  const before = spec ? beforeRoot(spec) : undefined;
  const story = await spokenFile(o.dir, "story.pcm", "Tell me a story.", "nova");
  const filler = await spokenFile(o.dir, "filler.pcm", "Mm-hmm.", "nova");
  const sides: Array<{ name: string; server: Server; barge: BargeReport[]; fillers: FillerReport[]; errors: string[] }> = [];
  try {
    const plan: Array<{ name: string; root: string; env: Record<string, string> }> = [
      ...(before ? [{ name: "before", root: before.root, env: {} }] : []),
      { name: "after", root: ROOT, env: {} },
      ...(THREADS0 ? [{ name: "after_audio_threads_0", root: ROOT, env: { PERCH_VOICE_AUDIO_THREADS: "0" } }] : []),
    ];
    for (const { name, root, env } of plan) {
      const dir = mkdtempSync(join(o.dir, `${name}-`));
      const server = await startServer(
        {
          PERCH_DATA_DIR: dir,
          ...env,
          ...benchConfig(dir, {
            providers: [{ id: "local", kind: "openai-compatible", base_url: o.upstreamUrl, max_retries: 0 }],
            models: [{ id: "chat", kind: "chat", provider: "local", upstream_model: "scripted" }],
            agents: [{ id: "talker", model: "chat", instructions: "Answer briefly.", voice: "alloy" }],
            voice: { agent: "talker" },
          }),
        },
        root,
      );
      sides.push({ name, server, barge: [], fillers: [], errors: [] });
      // Warm-up: models loaded, flite compiled.
      await devices(server, o.question, 1, 1, "turns", 2);
    }
    for (let r = 0; r < ROUNDS; r++)
      for (const side of sides)
        for (const m of await devices(side.server, o.question, 1, 1, "barge", TRIALS)) {
          if (m.type === "barge") side.barge.push(m);
          else if (m.type === "error") side.errors.push(m.message);
        }
    if (FILLERS > 0)
      for (const side of sides)
        for (const m of await devices(side.server, o.question, 1, 1, "filler", FILLERS, { STORY_FILE: story, FILLER_FILE: filler })) {
          if (m.type === "filler") side.fillers.push(m);
          else if (m.type === "error") side.errors.push(m.message);
        }
    const out: Record<string, unknown> = {
      before: before ? spec : "not measured: set BENCH_VOICE_BEFORE to a checkout or a git revision",
      goals: {
        onset_to_reply_paused_at_device_ms: "p95 ≤ 250 (voice.md §2, §7)",
        onset_to_last_reply_packet_ms: "p95 ≤ 1000 (voice.md §7: the EOS interrupted)",
        backchannel_resumed: "all (voice.md §7)",
      },
    };
    for (const side of sides)
      out[side.name] = {
        ...bargeFigures(side.barge),
        backchannel_over_reply: {
          trials: side.fillers.length,
          resumed: side.fillers.filter((f) => !f.interrupted && f.false_interruptions > 0).length,
          cut: side.fillers.filter((f) => f.interrupted).length,
        },
        errors: side.errors,
      };
    const ratio = (a: string, b: string) => {
      const [x, y] = [out[a], out[b]] as Array<ReturnType<typeof bargeFigures> | undefined>;
      if (!x || !y) return undefined;
      return {
        paused_p50: round(x.onset_to_reply_paused_at_device_ms.p50 / y.onset_to_reply_paused_at_device_ms.p50),
        paused_p95: round(x.onset_to_reply_paused_at_device_ms.p95 / y.onset_to_reply_paused_at_device_ms.p95),
        eos_p50: round(x.onset_to_last_reply_packet_ms.p50 / y.onset_to_last_reply_packet_ms.p50),
        eos_p95: round(x.onset_to_last_reply_packet_ms.p95 / y.onset_to_last_reply_packet_ms.p95),
      };
    };
    out.after_over_before = ratio("after", "before");
    if (THREADS0) out.threads_0_over_before = ratio("after_audio_threads_0", "before");
    return out;
  } finally {
    for (const side of sides) await side.server.stop();
    before?.remove();
  }
}
