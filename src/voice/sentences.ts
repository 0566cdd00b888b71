/** Words whose trailing period does not end a sentence. */
const ABBREVIATIONS = new Set(["mr", "mrs", "ms", "dr", "st", "prof", "sr", "jr", "vs", "etc", "e.g", "i.e", "no", "approx", "fig", "mt"]);
/** A first sentence shorter than this waits for the next one (flite speaks "Sure." no faster than "Sure, it is ten."). */
const MIN_FIRST_CHARS = 12;
/** Text longer than this without a sentence end is cut at a clause boundary, so synthesis never waits on a run-on sentence. */
const MAX_CHARS = 240;

/**
 * Cuts streamed text into sentences as soon as each one is complete, so that speech synthesis can
 * start on the first while the model is still writing. A sentence ends at `.`, `!`, `?` or `…`
 * (with closing quotes or brackets) followed by white space, or at a line break; not after an
 * abbreviation, an initial or inside a number (3.14).
 */
export class SentenceSplitter {
  private buffer = "";
  private emitted = 0;

  /** Adds text; returns the sentences it completed. */
  push(text: string): string[] {
    this.buffer += text;
    const out: string[] = [];
    for (;;) {
      const end = this.findEnd();
      if (end === undefined) break;
      const sentence = this.buffer.slice(0, end).trim();
      this.buffer = this.buffer.slice(end);
      if (sentence) {
        out.push(sentence);
        this.emitted++;
      }
    }
    return out;
  }

  /** The rest, when the text is complete. */
  flush(): string[] {
    const rest = this.buffer.trim();
    this.buffer = "";
    return rest ? [rest] : [];
  }

  private findEnd(): number | undefined {
    const b = this.buffer;
    const re = /([.!?…]+["')\]”’]*\s+)|(\n+)/g;
    for (let m = re.exec(b); m; m = re.exec(b)) {
      const end = m.index + m[0].length;
      if (m[2] === undefined) {
        const before = b.slice(0, m.index);
        const word = /([\p{L}.]+)$/u.exec(before)?.[1]?.toLowerCase() ?? "";
        if (b[m.index] === "." && (ABBREVIATIONS.has(word) || /^\p{L}$/u.test(word))) continue;
      }
      if (this.emitted === 0 && b.slice(0, end).trim().length < MIN_FIRST_CHARS) continue;
      return end;
    }
    if (b.length > MAX_CHARS) {
      const cut = Math.max(b.lastIndexOf(", ", MAX_CHARS), b.lastIndexOf("; ", MAX_CHARS), b.lastIndexOf(": ", MAX_CHARS));
      return cut > 0 ? cut + 2 : b.lastIndexOf(" ", MAX_CHARS) + 1 || MAX_CHARS;
    }
    return undefined;
  }
}
