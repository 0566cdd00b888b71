/**
 * Which words of a reply were actually heard: each sentence's text with the span of samples its
 * audio takes in the reply. After a barge-in the history keeps only the text up to the samples
 * played; inside a sentence the words are counted in proportion to the audio played.
 */
export class SpokenText {
  private readonly segments: Array<{ text: string; start: number; end: number }> = [];
  private total = 0;

  /** A sentence whose audio (`samples` long) follows what was added before. */
  add(text: string, samples: number): void {
    this.segments.push({ text, start: this.total, end: this.total + samples });
    this.total += samples;
  }

  /** More audio of the last sentence added (a sentence streamed from its engine). */
  extend(samples: number): void {
    const last = this.segments.at(-1);
    if (!last) return;
    last.end += samples;
    this.total += samples;
  }

  /** Samples of audio added so far. */
  get samples(): number {
    return this.total;
  }

  /** The text heard once `played` samples have been played. */
  heard(played: number): string {
    const parts: string[] = [];
    for (const s of this.segments) {
      if (played >= s.end) {
        parts.push(s.text);
        continue;
      }
      if (played > s.start) {
        const words = s.text.split(/\s+/).filter(Boolean);
        const n = Math.floor((words.length * (played - s.start)) / (s.end - s.start));
        if (n > 0) parts.push(words.slice(0, n).join(" "));
      }
      break;
    }
    return parts.join(" ");
  }

  /** The whole text. */
  get text(): string {
    return this.segments.map((s) => s.text).join(" ");
  }
}
