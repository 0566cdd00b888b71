/**
 * The recogniser's text as OpenAI's transcription models write it: numbers of ten and more (and
 * any number before a unit or "percent") as digits, "one" to "nine" left as words elsewhere; a
 * capital at the start, a full stop at the end when the model left none, single spaces.
 */

const UNITS: Record<string, number> = {
  zero: 0,
  one: 1,
  two: 2,
  three: 3,
  four: 4,
  five: 5,
  six: 6,
  seven: 7,
  eight: 8,
  nine: 9,
  ten: 10,
  eleven: 11,
  twelve: 12,
  thirteen: 13,
  fourteen: 14,
  fifteen: 15,
  sixteen: 16,
  seventeen: 17,
  eighteen: 18,
  nineteen: 19,
};
const TENS: Record<string, number> = { twenty: 20, thirty: 30, forty: 40, fifty: 50, sixty: 60, seventy: 70, eighty: 80, ninety: 90 };
const SCALES: Record<string, number> = { hundred: 100, thousand: 1000, million: 1_000_000, billion: 1_000_000_000 };

/** Words after which even a small number is written in digits. */
const UNIT_AFTER = new Set(
  "percent % degrees degree minutes minute seconds second hours hour days am pm a.m. p.m. kilometers kilometres miles meters metres kilograms kg pounds dollars euros cents volts watts".split(
    " ",
  ),
);

const isNumberWord = (w: string) => w in UNITS || w in TENS || w in SCALES;

/** The value of a run of number words ("two hundred and five"), or undefined when it is not one number. */
function numberValue(words: string[]): number | undefined {
  let total = 0;
  let current = 0;
  let last: "unit" | "ten" | "scale" | undefined;
  for (const w of words) {
    if (w in UNITS) {
      if (last === "unit" || (last === "ten" && UNITS[w]! >= 10) || (last === "ten" && current % 10 !== 0)) return undefined;
      current += UNITS[w]!;
      last = "unit";
    } else if (w in TENS) {
      if (last === "unit" || last === "ten") return undefined;
      current += TENS[w]!;
      last = "ten";
    } else if (w in SCALES) {
      const scale = SCALES[w]!;
      if (current === 0) current = 1;
      if (scale === 100) current *= 100;
      else {
        total += current * scale;
        current = 0;
      }
      last = "scale";
    } else return undefined;
  }
  return total + current;
}

/** Rewrites runs of number words in `text` as digits where OpenAI's models would. */
export function numbersToDigits(text: string): string {
  // Tokens keep their punctuation; a number run may end in a comma or full stop.
  const tokens = text.split(" ");
  const out: string[] = [];
  for (let i = 0; i < tokens.length; ) {
    const bare = (t: string) =>
      t
        .toLowerCase()
        .replace(/[.,!?;:]+$/, "")
        .split("-");
    let j = i;
    const run: string[] = [];
    while (j < tokens.length) {
      const parts = bare(tokens[j]!);
      const isAnd = parts.length === 1 && parts[0] === "and" && run.length > 0 && j + 1 < tokens.length && isNumberWord(bare(tokens[j + 1]!)[0]!);
      if (!isAnd && !parts.every(isNumberWord)) break;
      if (!isAnd) run.push(...parts);
      j++;
      // Punctuation ends the number.
      if (/[.,!?;:]$/.test(tokens[j - 1]!)) break;
    }
    const value = run.length > 0 ? numberValue(run) : undefined;
    const next = tokens[j]?.toLowerCase().replace(/[.,!?;:]+$/, "");
    if (value === undefined || (value < 10 && !(next !== undefined && UNIT_AFTER.has(next)))) {
      out.push(tokens[i]!);
      i++;
      continue;
    }
    const trailing = /[.,!?;:]+$/.exec(tokens[j - 1]!)?.[0] ?? "";
    if (next === "percent" && !trailing) {
      out.push(`${value}%${/[.,!?;:]+$/.exec(tokens[j]!)?.[0] ?? ""}`);
      i = j + 1;
      continue;
    }
    out.push(`${value}${trailing}`);
    i = j;
  }
  return out.join(" ");
}

/** Moonshine learnt some words from old books: "to-day", "to-morrow", "to-night". */
const ARCHAIC = /\b([Tt])o-(day|morrow|night)\b/g;

export function normaliseTranscript(raw: string): string {
  let text = raw.replace(/\s+/g, " ").trim();
  if (!text || !/[\p{L}\p{N}]/u.test(text)) return "";
  text = text.replace(ARCHAIC, "$1o$2");
  text = numbersToDigits(text);
  text = text[0]!.toUpperCase() + text.slice(1);
  text = text.replace(/[\s,;:-]+$/, "");
  if (!/[.!?…"')\]]$/.test(text)) text += ".";
  return text;
}
