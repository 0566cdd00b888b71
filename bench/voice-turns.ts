/**
 * The voice benchmark's turn-taking phase (`BENCH_VOICE_PHASES=taking`, voice.md §7): the same
 * device questions against two servers side by side in one run (voice-sides.ts), `before` (a
 * checkout named by `BENCH_VOICE_BEFORE`) and `after` (this checkout). Figures per server: end of speech → first reply audio heard at the device and
 * sent by the server (p50/p95), the end-of-utterance delay, the share of replies prepared in the
 * pause that were used, and, with a backchannel ("Mm-hmm.") said over a reply, how often the reply
 * resumed instead of being cut. The model's time to first token: `BENCH_MODEL_TTFT_MS` (the fake
 * upstream's). `BENCH_VOICE_AB_ROUNDS` (3) rounds of `BENCH_VOICE_AB_TURNS` (4) turns each;
 * `BENCH_VOICE_FILLERS` (4) backchannel trials per server.
 */
import { round } from "./support.ts";
import { pct } from "./voice.ts";
import type { FillerReport, TurnReport } from "./voice-device.ts";
import { spokenFile, voiceSideBySide } from "./voice-sides.ts";

const ROUNDS = Number(process.env.BENCH_VOICE_AB_ROUNDS ?? 3);
const TURNS = Number(process.env.BENCH_VOICE_AB_TURNS ?? 4);
const FILLERS = Number(process.env.BENCH_VOICE_FILLERS ?? 4);

function figures(turns: TurnReport[], fillers: FillerReport[]) {
  const server = (k: string) => pct(turns.map((t) => t.server[k]).filter((x): x is number => typeof x === "number"));
  const prepared = turns.filter((t) => t.server.preemptive === "used" || t.server.preemptive === "discarded");
  return {
    turns: turns.length,
    device_speech_to_audio_ms: pct(turns.map((t) => t.device_ms).filter((x): x is number => typeof x === "number")),
    server_speech_to_audio_ms: server("speech_to_audio"),
    end_of_utterance_ms: server("end_of_speech"),
    ttft_ms: server("ttft"),
    preemptive_used_share: turns.some((t) => "preemptive" in t.server)
      ? round(turns.filter((t) => t.server.preemptive === "used").length / Math.max(1, turns.length))
      : "n/a (no preemptive replies)",
    preemptive_asked: prepared.length,
    backchannel_over_reply: {
      trials: fillers.length,
      resumed: fillers.filter((f) => !f.interrupted && f.false_interruptions > 0).length,
      cut: fillers.filter((f) => f.interrupted).length,
    },
  };
}

export async function turnTaking(o: { dir: string; upstreamUrl: string; question: string }): Promise<unknown> {
  const story = await spokenFile(o.dir, "story.pcm", "Tell me a story.", "nova");
  const filler = await spokenFile(o.dir, "filler.pcm", "Mm-hmm.", "nova");
  return voiceSideBySide(o, [{ name: "after" }], async (sides, before) => {
    for (let round = 0; round < ROUNDS; round++) for (const side of sides) await side.measure("turns", TURNS);
    for (const side of sides) await side.measure("filler", FILLERS, { STORY_FILE: story, FILLER_FILE: filler });
    const out: Record<string, unknown> = {
      model_ttft_ms: Number(process.env.BENCH_MODEL_TTFT_MS ?? 0),
      before: before ?? "not measured: set BENCH_VOICE_BEFORE to a checkout or a git revision",
      goals: { device_speech_to_audio_ms: "≤ 450 p50 with an instant model, ≤ 700 p50 with a model 300 ms to its first token" },
    };
    for (const side of sides) out[side.name] = { ...figures(side.turns, side.fillers), errors: side.errors };
    const [b, a] = [out.before, out.after] as Array<ReturnType<typeof figures> | string>;
    if (typeof b === "object" && typeof a === "object")
      out.after_over_before = {
        device_speech_to_audio_p50: round(a.device_speech_to_audio_ms.p50 / b.device_speech_to_audio_ms.p50),
        device_speech_to_audio_p95: round(a.device_speech_to_audio_ms.p95 / b.device_speech_to_audio_ms.p95),
        server_speech_to_audio_p50: round(a.server_speech_to_audio_ms.p50 / b.server_speech_to_audio_ms.p50),
      };
    return out;
  });
}
