/**
 * The voice benchmark's turn-taking phase (`BENCH_VOICE_PHASES=taking`, voice.md §7): the same
 * device questions against two servers side by side in one run, `before` (a checkout named by
 * `BENCH_VOICE_BEFORE`: a directory, or a git revision checked out into a temporary worktree) and
 * `after` (this checkout), rounds alternating between them so that a machine whose speed moves
 * moves both alike. Figures per server: end of speech → first reply audio heard at the device and
 * sent by the server (p50/p95), the end-of-utterance delay, the share of replies prepared in the
 * pause that were used, and, with a backchannel ("Mm-hmm.") said over a reply, how often the reply
 * resumed instead of being cut. The model's time to first token: `BENCH_MODEL_TTFT_MS` (the fake
 * upstream's). `BENCH_VOICE_AB_ROUNDS` (3) rounds of `BENCH_VOICE_AB_TURNS` (4) turns each;
 * `BENCH_VOICE_FILLERS` (4) backchannel trials per server.
 */
import { execFileSync } from "node:child_process";
import { existsSync, mkdtempSync, symlinkSync, writeFileSync } from "node:fs";
import { tmpdir } from "node:os";
import { join } from "node:path";
import { createSpeechEngine } from "../src/ai/speech/index.ts";
import { loadResampler, Resampler } from "../src/audio/resampler.ts";
import { benchConfig, ROOT, round, type Server, startServer } from "./support.ts";
import { devices, pct } from "./voice.ts";
import type { DeviceMessage, FillerReport, TurnReport } from "./voice-device.ts";

const ROUNDS = Number(process.env.BENCH_VOICE_AB_ROUNDS ?? 3);
const TURNS = Number(process.env.BENCH_VOICE_AB_TURNS ?? 4);
const FILLERS = Number(process.env.BENCH_VOICE_FILLERS ?? 4);

/** 48 kHz PCM of `text` spoken by flite's `voice`, as a file the device processes read. */
export async function spokenFile(dir: string, name: string, text: string, voice: string): Promise<string> {
  const speech = createSpeechEngine();
  const { samples, sampleRate } = await speech.speak(text, voice);
  const up = new Resampler(await loadResampler(), sampleRate, 48_000);
  const padded = new Int16Array(samples.length + sampleRate / 10);
  padded.set(samples);
  const pcm = up.process(padded);
  up.close();
  const file = join(dir, name);
  writeFileSync(file, Buffer.from(pcm.buffer, pcm.byteOffset, pcm.byteLength));
  return file;
}

/** The `before` checkout: a directory as is, or a revision in a temporary worktree sharing this checkout's node_modules. */
export function beforeRoot(spec: string): { root: string; remove: () => void } {
  if (existsSync(join(spec, "bin/perch"))) return { root: spec, remove: () => {} };
  const root = mkdtempSync(join(tmpdir(), "perch-bench-before-"));
  execFileSync("git", ["-C", ROOT, "worktree", "add", "--detach", root, spec], { stdio: "ignore" });
  symlinkSync(join(ROOT, "node_modules"), join(root, "node_modules"));
  return { root, remove: () => execFileSync("git", ["-C", ROOT, "worktree", "remove", "--force", root], { stdio: "ignore" }) };
}

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
  const spec = process.env.BENCH_VOICE_BEFORE;
  const story = await spokenFile(o.dir, "story.pcm", "Tell me a story.", "nova");
  const filler = await spokenFile(o.dir, "filler.pcm", "Mm-hmm.", "nova");
  const before = spec ? beforeRoot(spec) : undefined;
  const sides: Array<{ name: string; server: Server; turns: TurnReport[]; fillers: FillerReport[]; errors: string[] }> = [];
  try {
    for (const [name, root] of [...(before ? [["before", before.root] as const] : []), ["after", ROOT] as const]) {
      const dir = mkdtempSync(join(o.dir, `${name}-`));
      const server = await startServer(
        {
          PERCH_DATA_DIR: dir,
          ...benchConfig(dir, {
            providers: [{ id: "local", kind: "openai-compatible", base_url: o.upstreamUrl, max_retries: 0 }],
            models: [{ id: "chat", kind: "chat", provider: "local", upstream_model: "scripted" }],
            agents: [{ id: "talker", model: "chat", instructions: "Answer briefly.", voice: "alloy" }],
            voice: { agent: "talker" },
          }),
        },
        root,
      );
      sides.push({ name, server, turns: [], fillers: [], errors: [] });
      // Warm-up: models loaded, flite compiled.
      await devices(server, o.question, 1, 1, "turns", 2);
    }
    const take = (side: (typeof sides)[number], reports: DeviceMessage[]) => {
      for (const r of reports) {
        if (r.type === "turn") side.turns.push(r);
        else if (r.type === "filler") side.fillers.push(r);
        else if (r.type === "error") side.errors.push(r.message);
      }
    };
    for (let round = 0; round < ROUNDS; round++) for (const side of sides) take(side, await devices(side.server, o.question, 1, 1, "turns", TURNS));
    for (const side of sides) take(side, await devices(side.server, o.question, 1, 1, "filler", FILLERS, { STORY_FILE: story, FILLER_FILE: filler }));
    const out: Record<string, unknown> = {
      model_ttft_ms: Number(process.env.BENCH_MODEL_TTFT_MS ?? 0),
      before: before ? spec : "not measured: set BENCH_VOICE_BEFORE to a checkout or a git revision",
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
  } finally {
    for (const side of sides) await side.server.stop();
    before?.remove();
  }
}
