/**
 * `npm run bench -- backchannel` (issue 50): is the sound over a reply a barge-in? Backchannels
 * ("Mm-hmm.", "Uh-huh.", "Mhm.", "Hmm.", "Mm.") and real short barge-ins ("Stop.", "Wait.", "Hold on.",
 * "Okay stop.", "What?", "No no no.") by ten voices (flite's six, espeak-ng's en-us, en-gb-x-rp,
 * en-us+f3 and en-us+m3), each sent as a device's microphone sends it (48 kHz Opus, decoded at 16 kHz)
 * and heard as the conversation hears speech over a reply: the real recogniser (one process of two
 * threads, Moonshine base, greedy, as for turns), asked for the words so far as the turn logic asks
 * (src/voice/activity.ts `checkWords`: at `min_ms` (400) after the onset, then every 200 ms while the
 * sound lasts, 100 ms after sure words that must be heard again), and at the end of the sound
 * (`overEnded`); the product now asks first 100 ms before `min_ms`. Two rules judged on the same
 * recognitions, side by side:
 *
 * - `before`: sure when the words' mean token log-probability is at least −0.35, one judgement
 *   enough; the end of the sound judged on its final transcript (any word a barge-in).
 * - `after` (the product now): sure when the model finds the words far likelier than any backchannel
 *   text scored against the same audio (embedded-engines.ts `sureOf`); while the sound goes on, sure
 *   words must be heard again (their first two words first) in the words so far 100 ms later; the
 *   end judged on the sure words of the whole.
 *
 * Reported: for each rule, the backchannels that would end the reply (goal: none) and the real
 * barge-ins (of at least `min_ms`, the others are never one by §7) that it would miss, with when it
 * decides (the check's time after the onset; onset → `EOS interrupted` adds the recognition, whose
 * time is reported beside: `judge_ms`, a recognition and the scoring when there are words).
 */
import { availableParallelism, loadavg } from "node:os";
import { createSpeechEngine, createTranscriptionEngine } from "../src/ai/speech/index.ts";
import type { Heard } from "../src/ai/speech/moonshine.ts";
import { BACKCHANNEL_TEXTS, sureOf } from "../src/voice/embedded-engines.ts";
import { contentWords, leadingSaid } from "../src/voice/turn-end.ts";
import { espeak } from "../test/support/speech.ts";
import { throughUplink } from "./hearing.ts";
import { RATE } from "./speech-set.ts";
import { round } from "./support.ts";
import { pct } from "./voice.ts";

const FLITE = ["alloy", "echo", "fable", "onyx", "nova", "shimmer"];
const ESPEAK: Array<[string, string[]]> = [
  ["en-us", ["-v", "en-us", "-s", "150"]],
  ["en-gb-x-rp", ["-v", "en-gb-x-rp", "-s", "150"]],
  ["en-us+f3", ["-v", "en-us+f3", "-s", "160"]],
  ["en-us+m3", ["-v", "en-us+m3", "-s", "150"]],
];
const BACKCHANNELS = ["Mm-hmm.", "Uh-huh.", "Mhm.", "Hmm.", "Mm."];
const BARGE_INS = ["Stop.", "Wait.", "Hold on.", "Okay stop.", "What?", "No no no."];
/** voice.md §7's defaults and the turn logic's steps (src/voice/activity.ts). */
const MIN_MS = 400;
const SOUND_SLACK_MS = 40;
const RECHECK_MS = 200;
const CONFIRM_MS = 100;
const ENDED_MS = 100;
/** The end of the sound is decided this long after its last sound (`turn.finished_silence_ms`). */
const END_MS = 250;
/** The audio a turn's transcription gets from before the detector's onset. */
const PREROLL_MS = 200;

/** `after_confirm_200`: the product's rule with the words heard again 200 ms later instead of 100 (an experiment). */
type Rule = "before" | "after" | "after_confirm_200";
const CONFIRMS: Array<[Rule, number]> = [
  ["after", CONFIRM_MS],
  ["after_confirm_200", 200],
];
interface Judged {
  voice: string;
  said: string;
  kind: "backchannel" | "barge-in";
  sound_ms: number;
  /** When each rule made it a barge-in (ms after the onset), or undefined. */
  decided: Record<Rule, number | undefined>;
  /** What was heard when each rule decided (or at the end). */
  heard: Record<Rule, string>;
}

async function say(voice: string, text: string, flite: ReturnType<typeof createSpeechEngine>): Promise<Float32Array> {
  const e = ESPEAK.find(([name]) => name === voice);
  const pcm = e ? Int16Array.from(await espeak(text, e[1]), (x) => Math.round(Math.max(-1, Math.min(1, x)) * 32767)) : (await flite.speak(text, voice)).samples;
  const padded = new Int16Array(pcm.length + RATE / 2);
  padded.set(pcm);
  return Float32Array.from(await throughUplink(padded, 16_000), (x) => x / 32768);
}

/** The first and last 20 ms blocks with sound (RMS ≥ 0.01), in samples. */
function soundOf(a: Float32Array): { on: number; off: number } {
  const block = RATE / 50;
  let on = -1;
  let off = 0;
  for (let at = 0; at + block <= a.length; at += block) {
    let sum = 0;
    for (let i = at; i < at + block; i++) sum += a[i]! * a[i]!;
    if (Math.sqrt(sum / block) < 0.01) continue;
    if (on < 0) on = at;
    off = at + block;
  }
  return { on: Math.max(0, on), off };
}

export async function backchannelBench(): Promise<unknown> {
  const started = performance.now();
  const load = loadavg()[0]!;
  const engine = createTranscriptionEngine({ processes: 1, threads: Math.min(2, availableParallelism()), fastAfterMs: false });
  const flite = createSpeechEngine({ concurrency: 1 });
  const judgeMs: number[] = [];
  const results: Judged[] = [];
  try {
    await engine.startRecognition();
    for (const voice of [...FLITE, ...ESPEAK.map(([name]) => name)])
      for (const [kind, list] of [
        ["backchannel", BACKCHANNELS],
        ["barge-in", BARGE_INS],
      ] as const)
        for (const said of list) {
          const audio = await say(voice, said, flite);
          const { on, off } = soundOf(audio);
          const soundMs = ((off - on) / RATE) * 1000;
          const start = Math.max(0, on - (PREROLL_MS * RATE) / 1000);
          // One recogniser for the utterance, fed as the uplink feeds it: it reuses a recognition that covers the sound.
          const asr = engine.createIncrementalRecogniser();
          let pushed = start;
          const upTo = async (ms: number) => {
            const to = Math.min(audio.length, on + Math.round((ms * RATE) / 1000));
            if (to > pushed) asr.push(audio.slice(pushed, to));
            pushed = Math.max(pushed, to);
          };
          // Every 100 ms from min_ms to the end, in order (the turn logic's checks fall on these), and the end.
          const endAt = soundMs + END_MS;
          const memo = new Map<Heard, { text: string; sure: boolean; old: boolean }>();
          const judged = new Map<number, { text: string; sure: boolean; old: boolean }>();
          const FIRST = MIN_MS - CONFIRM_MS;
          for (const t of [...Array.from({ length: Math.max(0, Math.ceil((endAt - FIRST) / CONFIRM_MS)) }, (_, i) => FIRST + i * CONFIRM_MS), endAt]) {
            await upTo(t);
            const t0 = performance.now();
            const heard = await asr.heardSoFar();
            let known = memo.get(heard);
            if (!known) {
              const words = contentWords(heard.text) > 0;
              const scores = words ? await asr.scoreHeard(heard, BACKCHANNEL_TEXTS) : [];
              known = { text: heard.text, sure: words && sureOf(heard, scores), old: words && heard.logprob >= -0.35 };
              memo.set(heard, known);
              judgeMs.push(performance.now() - t0);
            }
            judged.set(t, known);
          }
          const judge = (t: number) => judged.get(t)!;
          const decided: Judged["decided"] = { before: undefined, after: undefined, after_confirm_200: undefined };
          const heardAt: Judged["heard"] = { before: "", after: "", after_confirm_200: "" };
          // A sound shorter than min_ms (less the slack) is never judged while it lasts, and never a barge-in (§7).
          if (soundMs >= MIN_MS - SOUND_SLACK_MS) {
            // before: one sure judgement at min_ms and every 200 ms while the sound lasts.
            for (let t = MIN_MS; t < endAt; t += RECHECK_MS) {
              const j = judge(t);
              if (j.old) {
                decided.before = t;
                heardAt.before = j.text;
                break;
              }
            }
            // after: asked first 100 ms before min_ms, then as before; sure words heard again first in the
            // words so far 100 ms later, or sure once the sound had ended; asked only while the sound goes
            // on or once it lasted min_ms.
            const next = (t: number) => (t < MIN_MS ? MIN_MS : t + RECHECK_MS);
            const lasted = soundMs >= MIN_MS - SOUND_SLACK_MS;
            for (const [rule, confirm] of CONFIRMS) {
              let lead: string[] | undefined;
              for (let t = FIRST; t < endAt; ) {
                if (!lasted && t - soundMs > SOUND_SLACK_MS) {
                  t = next(t);
                  continue;
                }
                const j = judge(t);
                const said = leadingSaid(j.text);
                if (lead) {
                  if (lead.every((w, i) => said[i] === w)) {
                    decided[rule] = t;
                    heardAt[rule] = j.text;
                    break;
                  }
                  lead = undefined;
                  t = next(t);
                } else if (j.sure) {
                  if (t - soundMs >= ENDED_MS) {
                    decided[rule] = t;
                    heardAt[rule] = j.text;
                    break;
                  }
                  lead = said.slice(0, 2);
                  t += confirm;
                } else t = next(t);
              }
            }
          }
          if (soundMs >= MIN_MS) {
            const whole = judge(endAt);
            if (decided.before === undefined && contentWords(whole.text) > 0) [decided.before, heardAt.before] = [endAt, whole.text];
            for (const [rule] of CONFIRMS) if (decided[rule] === undefined && whole.sure) [decided[rule], heardAt[rule]] = [endAt, whole.text];
            for (const rule of ["before", ...CONFIRMS.map(([r]) => r)] as Rule[]) heardAt[rule] ||= whole.text;
          }
          await asr.finish().catch(() => "");
          results.push({ voice, said, kind, sound_ms: Math.round(soundMs), decided, heard: heardAt });
        }
  } finally {
    await engine.close();
  }
  const figures = (rule: Rule) => {
    const backs = results.filter((r) => r.kind === "backchannel");
    const barges = results.filter((r) => r.kind === "barge-in" && r.sound_ms >= MIN_MS);
    const cut = backs.filter((r) => r.decided[rule] !== undefined);
    const missed = barges.filter((r) => r.decided[rule] === undefined);
    const at = barges.flatMap((r) => (r.decided[rule] !== undefined ? [r.decided[rule]!] : []));
    return {
      backchannels: backs.length,
      backchannels_resumed: backs.length - cut.length,
      backchannels_cut: cut.map((r) => `${r.voice} "${r.said}" → "${r.heard[rule]}" at ${r.decided[rule]} ms`),
      barge_ins: barges.length,
      barge_ins_ended: barges.length - missed.length,
      barge_ins_missed: missed.map((r) => `${r.voice} "${r.said}" (${r.sound_ms} ms) → "${r.heard[rule]}"`),
      decided_after_onset_ms: pct(at),
      by_said: Object.fromEntries(
        [...BACKCHANNELS, ...BARGE_INS].map((said) => {
          const of = results.filter((r) => r.said === said && (r.kind === "backchannel" || r.sound_ms >= MIN_MS));
          return [said, `${of.filter((r) => r.decided[rule] !== undefined).length} of ${of.length} a barge-in`];
        }),
      ),
    };
  };
  return {
    suite: "backchannel",
    load_before: round(load),
    load_after: round(loadavg()[0]!),
    seconds: round((performance.now() - started) / 1000),
    goals: { backchannels_resumed: "all (voice.md §7)", barge_ins_ended: "all, onset → EOS interrupted p95 ≤ 1 s" },
    judge_ms: pct(judgeMs),
    before: figures("before"),
    after: figures("after"),
    after_confirm_200: figures("after_confirm_200"),
    sounds: results.map((r) => ({
      voice: r.voice,
      said: r.said,
      sound_ms: r.sound_ms,
      before: r.decided.before ?? null,
      after: r.decided.after ?? null,
      heard: r.heard.after,
    })),
  };
}
