/**
 * The voice benchmark's side-by-side runs (voice-turns.ts, voice-barge.ts): `before` (a checkout
 * named by `BENCH_VOICE_BEFORE`: a directory, or a git revision checked out into a temporary
 * worktree) and this checkout's variants, each its own `perch serve` whose agent `talker` talks to
 * the fake upstream, warmed up; then the caller's rounds, alternating between the servers so that a
 * machine whose speed moves moves them all alike. What each server's devices report is kept by kind.
 */
import { mkdtempSync, writeFileSync } from "node:fs";
import { join } from "node:path";
import { createSpeechEngine } from "../src/ai/speech/index.ts";
import { loadResampler, Resampler } from "../src/audio/resampler.ts";
import { benchConfig, checkoutOf, ROOT, type Server, startServer } from "./support.ts";
import { devices } from "./voice.ts";
import type { BargeReport, FillerReport, TurnReport } from "./voice-device.ts";

/** One server of the run and what its devices reported. */
export interface VoiceSide {
  name: string;
  server: Server;
  turns: TurnReport[];
  barge: BargeReport[];
  fillers: FillerReport[];
  errors: string[];
  /** One device on this server speaking `count` times in `mode`; its reports kept above. */
  measure(mode: "turns" | "barge" | "filler", count: number, env?: Record<string, string>): Promise<void>;
}

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

/**
 * Starts `before` (when BENCH_VOICE_BEFORE names it) and each of `variants` of this checkout (their
 * environment added), runs `measure` on them, and stops them whatever happens. `before` is the
 * revision's name, or undefined when none was set.
 */
export async function voiceSideBySide<R>(
  o: { dir: string; upstreamUrl: string; question: string },
  variants: Array<{ name: string; env?: Record<string, string> }>,
  measure: (sides: VoiceSide[], before: string | undefined) => Promise<R>,
): Promise<R> {
  const spec = process.env.BENCH_VOICE_BEFORE;
  const before = spec ? checkoutOf(spec) : undefined;
  const sides: VoiceSide[] = [];
  try {
    for (const { name, root, env } of [...(before ? [{ name: "before", root: before.root, env: {} }] : []), ...variants.map((v) => ({ ...v, root: ROOT }))]) {
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
      const side: VoiceSide = {
        name,
        server,
        turns: [],
        barge: [],
        fillers: [],
        errors: [],
        async measure(mode, count, extra) {
          for (const m of await devices(server, o.question, 1, 1, mode, count, extra)) {
            if (m.type === "turn") side.turns.push(m);
            else if (m.type === "barge") side.barge.push(m);
            else if (m.type === "filler") side.fillers.push(m);
            else if (m.type === "error") side.errors.push(m.message);
          }
        },
      };
      sides.push(side);
      // Warm-up: models loaded, flite compiled.
      await devices(server, o.question, 1, 1, "turns", 2);
    }
    return await measure(sides, spec);
  } finally {
    for (const side of sides) await side.server.stop();
    before?.remove();
  }
}
