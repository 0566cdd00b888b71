import { numbersToDigits } from "../../src/ai/speech/normalise.ts";

/**
 * Word error rate: the word-level edit distance from `reference` to `hypothesis`, over the
 * reference's length. Case, punctuation and hyphens are ignored; numbers compare as digits ("ten" = "10").
 */
export function wordErrorRate(reference: string, hypothesis: string): number {
  const words = (t: string) =>
    numbersToDigits(t)
      .toLowerCase()
      .replace(/(\w)-(\w)/g, "$1$2")
      .replace(/[^a-z0-9' ]/g, " ")
      .split(/\s+/)
      .filter(Boolean);
  const ref = words(reference);
  const hyp = words(hypothesis);
  let row = Array.from({ length: hyp.length + 1 }, (_, j) => j);
  for (let i = 1; i <= ref.length; i++) {
    const next = [i];
    for (let j = 1; j <= hyp.length; j++) next[j] = Math.min(row[j]! + 1, next[j - 1]! + 1, row[j - 1]! + (ref[i - 1] === hyp[j - 1] ? 0 : 1));
    row = next;
  }
  return row[hyp.length]! / ref.length;
}

/** Everyday requests to a voice device. */
export const ROUND_TRIP_SENTENCES = [
  "Please turn on the lights in the kitchen.",
  "What is the weather like today?",
  "Set a timer for ten minutes.",
  "Play some music in the living room.",
  "The battery is almost empty.",
  "Call my mother tomorrow morning.",
  "How far is the nearest train station?",
  "Remind me to buy milk after work.",
  "Open the front door.",
  "I would like a cup of coffee.",
];
