/**
 * `Date#toISOString` and `Date.parse` for the status document's `reported_at`, which the telemetry
 * writer parses and writes for every peer of every batch: both cost a microsecond or more in V8,
 * more than the rest of the merge. The day's part of the text ("YYYY-MM-DDT") is kept for the last
 * day seen, and the time of day is done in arithmetic; anything else (another day's text, an
 * offset, a time before 1970 or after 9999) goes to `Date` itself, so the results are always Date's.
 */
const DAY_MS = 86_400_000;
/** 10000-01-01T00:00:00.000Z: from there on `toISOString` writes six-digit years. */
const END_MS = 253_402_300_800_000;
const TWO = Array.from({ length: 100 }, (_, i) => String(i).padStart(2, "0"));
const THREE = Array.from({ length: 1000 }, (_, i) => String(i).padStart(3, "0"));

let cachedDay = Number.NaN;
let cachedPrefix = "";

function dayPrefix(day: number): string {
  if (day !== cachedDay) {
    cachedPrefix = new Date(day * DAY_MS).toISOString().slice(0, 11);
    cachedDay = day;
  }
  return cachedPrefix;
}

/** `new Date(ms).toISOString()`. */
export function isoTime(ms: number): string {
  if (!(ms >= 0 && ms < END_MS) || !Number.isInteger(ms)) return new Date(ms).toISOString();
  const day = Math.floor(ms / DAY_MS);
  let rest = ms - day * DAY_MS;
  const h = Math.floor(rest / 3_600_000);
  rest -= h * 3_600_000;
  const m = Math.floor(rest / 60_000);
  rest -= m * 60_000;
  const s = Math.floor(rest / 1000);
  return `${dayPrefix(day)}${TWO[h]}:${TWO[m]}:${TWO[s]}.${THREE[rest - s * 1000]}Z`;
}

/** A decimal digit's value at `i`, NaN for anything else. */
function digit(text: string, i: number): number {
  const d = text.charCodeAt(i) - 48;
  return d >= 0 && d <= 9 ? d : Number.NaN;
}

/** `Date.parse(text)`. */
export function parseTime(text: string): number {
  if (
    text.length === 24 &&
    cachedPrefix !== "" &&
    text.startsWith(cachedPrefix) &&
    text[13] === ":" &&
    text[16] === ":" &&
    text[19] === "." &&
    text[23] === "Z"
  ) {
    const h = digit(text, 11) * 10 + digit(text, 12);
    const m = digit(text, 14) * 10 + digit(text, 15);
    const s = digit(text, 17) * 10 + digit(text, 18);
    const ms = digit(text, 20) * 100 + digit(text, 21) * 10 + digit(text, 22);
    // NaN fails every comparison; 24:00 and the like are left to Date.
    if (h < 24 && m < 60 && s < 60 && ms >= 0) return cachedDay * DAY_MS + h * 3_600_000 + m * 60_000 + s * 1000 + ms;
  }
  return Date.parse(text);
}
