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
import { round } from "./support.ts";
import { pct } from "./voice.ts";
import type { BargeReport } from "./voice-device.ts";
import { spokenFile, voiceSideBySide } from "./voice-sides.ts";

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
  const story = await spokenFile(o.dir, "story.pcm", "Tell me a story.", "nova");
  const filler = await spokenFile(o.dir, "filler.pcm", "Mm-hmm.", "nova");
  const variants = [{ name: "after" }, ...(THREADS0 ? [{ name: "after_audio_threads_0", env: { PERCH_VOICE_AUDIO_THREADS: "0" } }] : [])];
  return voiceSideBySide(o, variants, async (sides, before) => {
    for (let r = 0; r < ROUNDS; r++) for (const side of sides) await side.measure("barge", TRIALS);
    if (FILLERS > 0) for (const side of sides) await side.measure("filler", FILLERS, { STORY_FILE: story, FILLER_FILE: filler });
    const out: Record<string, unknown> = {
      before: before ?? "not measured: set BENCH_VOICE_BEFORE to a checkout or a git revision",
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
      const [x, y] = [out[a], out[b]] as Array<ReturnType<typeof bargeFigures> | string | undefined>;
      // `before` is a note, not figures, when it was not measured.
      if (typeof x !== "object" || typeof y !== "object") return undefined;
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
  });
}
