/** A piece of text flite speaks in one run, and the silence that follows it (seconds at speed 1). */
export interface SpeechChunk {
  text: string;
  pauseAfter: number;
}

/** Words in the first chunk: flite needs ~5 ms a word (~1 ms with the diphone voice), and the first chunk decides time to first byte. */
const FIRST_CHUNK_WORDS = 8;
/** Longer sentences are spoken clause by clause. */
const MAX_CHUNK_WORDS = 24;
const SENTENCE_PAUSE = 0.3;
const CLAUSE_PAUSE = 0.12;
/** Between two halves of a clause cut for latency: enough not to click, too short to hear as a pause. */
const CUT_PAUSE = 0.02;

/** Words before which a clause can be cut with the least damage to its rhythm. */
const CUT_BEFORE = new Set(
  "and or but while because when where which who that to for with of in on at from into over under after before than so as if".split(" "),
);

const ABBREVIATION = /(?:^|\s)(?:mr|mrs|ms|dr|st|prof|sr|jr|vs|etc|e\.g|i\.e|[a-z])\.$/i;

/** What flite can read: ASCII with the typographic marks mapped, accents dropped, controls removed. */
export function normalizeForSpeech(text: string): string {
  return text
    .normalize("NFKD")
    .replace(/\p{M}/gu, "")
    .replace(/[\u2018\u2019\u201A\u2032]/g, "'")
    .replace(/[\u201C\u201D\u201E\u2033]/g, '"')
    .replace(/\s*[\u2013\u2014\u2015]\s*/g, ", ")
    .replace(/\u2026/g, "...")
    .replace(/[^\x20-\x7E\n]/g, " ")
    .replace(/[ \t]+/g, " ")
    .trim();
}

function words(text: string): string[] {
  return text.split(" ").filter((w) => w.length > 0);
}

/** Splits a sentence at , ; : into clauses, then merges neighbours while they fit in MAX_CHUNK_WORDS. */
function clauses(sentence: string): string[] {
  const parts = sentence.split(/(?<=[,;:])\s+/).filter((p) => p.length > 0);
  const merged: string[] = [];
  for (const part of parts) {
    const last = merged.at(-1);
    if (last !== undefined && words(last).length + words(part).length <= MAX_CHUNK_WORDS) merged[merged.length - 1] = `${last} ${part}`;
    else merged.push(part);
  }
  // A clause longer than the limit on its own is cut at word boundaries.
  return merged.flatMap((clause) => {
    const w = words(clause);
    const out: string[] = [];
    for (let i = 0; i < w.length; i += MAX_CHUNK_WORDS) out.push(w.slice(i, i + MAX_CHUNK_WORDS).join(" "));
    return out;
  });
}

/** Where to cut a first chunk that is too long: a clause mark, else before a joining word, else at the limit. */
function firstCut(w: string[]): number {
  for (let i = FIRST_CHUNK_WORDS - 1; i >= 2; i--) if (/[,;:]$/.test(w[i]!)) return i + 1;
  for (let i = FIRST_CHUNK_WORDS; i >= 3; i--) if (CUT_BEFORE.has(w[i]!.toLowerCase())) return i;
  return FIRST_CHUNK_WORDS;
}

/**
 * The chunks to synthesize one after another: sentences, long sentences by clause, and a short
 * first chunk so that the first audio leaves early. Each chunk ends with the pause its
 * punctuation asks for; the engine trims flite's own leading and trailing silence.
 */
export function speechChunks(text: string): SpeechChunk[] {
  const normalized = normalizeForSpeech(text);
  const sentences: string[] = [];
  for (const piece of normalized.split(/(?<=[.!?]["')\]]*)\s+|\n+/)) {
    const last = sentences.at(-1);
    // "Dr. Smith" and "wait... what" are one sentence.
    if (last !== undefined && (ABBREVIATION.test(last) || /^[a-z]/.test(piece))) sentences[sentences.length - 1] = `${last} ${piece.trim()}`;
    else sentences.push(piece.trim());
  }
  const chunks: SpeechChunk[] = [];
  for (const sentence of sentences.filter((s) => /[A-Za-z0-9]/.test(s))) {
    const parts = words(sentence).length > MAX_CHUNK_WORDS ? clauses(sentence) : [sentence];
    for (const [i, part] of parts.entries()) chunks.push({ text: part, pauseAfter: i === parts.length - 1 ? SENTENCE_PAUSE : CLAUSE_PAUSE });
  }
  const first = chunks[0];
  if (first) {
    const w = words(first.text);
    if (w.length > FIRST_CHUNK_WORDS + 2) {
      const cut = firstCut(w);
      const head = w.slice(0, cut).join(" ");
      chunks.splice(
        0,
        1,
        { text: head, pauseAfter: /[,;:]$/.test(head) ? CLAUSE_PAUSE : CUT_PAUSE },
        { text: w.slice(cut).join(" "), pauseAfter: first.pauseAfter },
      );
    }
  }
  return chunks;
}
