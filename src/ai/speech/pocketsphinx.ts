import { existsSync } from "node:fs";
import { mkdtemp, rm, writeFile } from "node:fs/promises";
import { availableParallelism, tmpdir } from "node:os";
import { join } from "node:path";
import { findExecutable, startChild } from "./child.ts";
import { DECODED_SAMPLE_RATE, decodeAudio, toInt16 } from "./decode.ts";
import { abortReason, EngineBusyError, UnsupportedLanguageError } from "./errors.ts";
import { type QueueLimits, WorkQueue } from "./queue.ts";
import type { TranscribeOptions, Transcript, TranscriptionEngine, TranscriptSegment, TranscriptWord } from "./types.ts";

/** Where Debian's pocketsphinx-en-us puts the model. */
export const DEBIAN_MODEL_DIR = "/usr/share/pocketsphinx/model/en-us";

export interface RecogniserPaths {
  binary: string;
  /** The acoustic model directory, the language model and the pronunciation dictionary. */
  hmm: string;
  lm: string;
  dict: string;
}

/** The recogniser and its model, or undefined when either is missing. */
export function findRecogniser(modelDir = DEBIAN_MODEL_DIR, binary = findExecutable("pocketsphinx_continuous")): RecogniserPaths | undefined {
  if (!binary) return undefined;
  const paths = { binary, hmm: join(modelDir, "en-us"), lm: join(modelDir, "en-us.lm.bin"), dict: join(modelDir, "cmudict-en-us.dict") };
  if (!existsSync(join(paths.hmm, "mdef")) || !existsSync(paths.lm) || !existsSync(paths.dict)) return undefined;
  return paths;
}

/** `<word> <start s> <end s> <posterior>` as printed with `-time yes`; `<s>` and `</s>` bound one utterance. */
const TIMED_WORD = /^(\S+) (\d+(?:\.\d+)?) (\d+(?:\.\d+)?) \S+$/;

/**
 * Utterances become segments, with their first and last word's times. Silence (`<sil>`) and
 * fillers (`[NOISE]`, `++UM++`) are dropped, alternative pronunciations (`read(2)`) named as the word.
 */
export function parseTimedOutput(output: string): { segments: TranscriptSegment[]; words: TranscriptWord[] } {
  const segments: TranscriptSegment[] = [];
  const words: TranscriptWord[] = [];
  let utterance: TranscriptWord[] = [];
  const close = () => {
    if (utterance.length === 0) return;
    segments.push({ id: segments.length, start: utterance[0]!.start, end: utterance.at(-1)!.end, text: utterance.map((w) => w.word).join(" ") });
    utterance = [];
  };
  for (const line of output.split("\n")) {
    const m = TIMED_WORD.exec(line.trim());
    if (!m) continue;
    const token = m[1]!;
    if (token === "<s>" || token === "</s>") {
      close();
      continue;
    }
    if (token === "<sil>" || /^(\[.*\]|\+\+.*\+\+)$/.test(token)) continue;
    const word = { word: token.replace(/\(\d+\)$/, ""), start: Number(m[2]), end: Number(m[3]) };
    utterance.push(word);
    words.push(word);
  }
  close();
  return { segments, words };
}

export interface TranscriptionEngineOptions extends Partial<QueueLimits> {}

/**
 * The upload is decoded (decode.ts: bounded in duration and CPU time) to 16 kHz mono PCM, which `pocketsphinx_continuous` splits into utterances at silences, printing each word with
 * its start and end.
 */
export class PocketSphinxEngine implements TranscriptionEngine {
  readonly languages: readonly string[] = ["en"];
  readonly wordTimestamps = true;
  private readonly paths: RecogniserPaths;
  private readonly queue: WorkQueue;

  constructor(paths: RecogniserPaths, options: TranscriptionEngineOptions = {}) {
    this.paths = paths;
    this.queue = new WorkQueue({ concurrency: options.concurrency ?? availableParallelism(), maxQueued: options.maxQueued ?? 16 });
  }

  async transcribe(o: TranscribeOptions): Promise<Transcript> {
    if (o.language !== undefined && !this.languages.includes(o.language.toLowerCase())) throw new UnsupportedLanguageError(o.language, this.languages);
    if (!this.queue.accepts()) throw new EngineBusyError();
    return this.queue.run(() => this.recognise(o.audio, o.maxSeconds, o.signal), o.signal);
  }

  private async recognise(audio: Uint8Array, maxSeconds: number | undefined, signal: AbortSignal | undefined): Promise<Transcript> {
    if (signal?.aborted) throw abortReason(signal);
    // Bounded: at most `maxSeconds` of audio, in memory (see decode.ts).
    const decoded = await decodeAudio(audio, { ...(maxSeconds !== undefined ? { maxSeconds } : {}), ...(signal ? { signal } : {}) });
    const samples = decoded.samples.length;
    const dir = await mkdtemp(join(tmpdir(), "perch-asr-"));
    try {
      // The recogniser opens its input by name and cannot read a socket, which is what a child's
      // stdin is: the decoded PCM (at most the duration limit's worth) goes to a file for it.
      const pcm = join(dir, "input.raw");
      const int16 = toInt16(decoded.samples);
      await writeFile(pcm, new Uint8Array(int16.buffer, int16.byteOffset, int16.byteLength));
      const { binary, hmm, lm, dict } = this.paths;
      const args = ["-hmm", hmm, "-lm", lm, "-dict", dict, "-samprate", String(DECODED_SAMPLE_RATE), "-time", "yes", "-infile", pcm];
      // Without the second (flat-lexicon) pass recognition takes about half the time, with no loss
      // of accuracy on our round-trip sentences. (Narrower beams, -topn 2, -ds 2 or a cap on
      // active HMMs saved at most another 10–20 % and each cost words.)
      args.push("-fwdflat", "no");
      const recogniser = startChild(binary, args, signal);
      recogniser.proc.stdin.end();
      let output = "";
      recogniser.proc.stdout.setEncoding("utf8");
      recogniser.proc.stdout.on("data", (text: string) => {
        output += text;
      });
      const recognised = await recogniser.exited;
      if (signal?.aborted) throw abortReason(signal);
      if (recognised.code !== 0) throw new Error(`pocketsphinx failed: ${lastLine(recognised.stderr) || `exit ${recognised.code ?? recognised.signal}`}`);
      const { segments, words } = parseTimedOutput(output);
      return {
        language: "en",
        duration: samples / DECODED_SAMPLE_RATE,
        text: segments.map((s) => s.text).join(" "),
        segments,
        words,
      };
    } finally {
      await rm(dir, { recursive: true, force: true });
    }
  }
}

function lastLine(text: string): string {
  return text.trim().split("\n").at(-1) ?? "";
}
