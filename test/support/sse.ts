/**
 * The tests' and benches' one reader of event streams (`text/event-stream`): blocks split as they
 * arrive, a block's fields, a whole response's JSON payloads, and a client of `GET /side-control/events`.
 */

/** The blocks (separated by a blank line) of an event stream's body, each as soon as it is whole. */
export async function* sseBlocks(body: AsyncIterable<Uint8Array>): AsyncGenerator<string> {
  const decoder = new TextDecoder();
  let buffer = "";
  for await (const chunk of body) {
    buffer += decoder.decode(chunk, { stream: true });
    let at = buffer.indexOf("\n\n");
    while (at >= 0) {
      yield buffer.slice(0, at);
      buffer = buffer.slice(at + 2);
      at = buffer.indexOf("\n\n");
    }
  }
}

/** One block's fields: its comment lines, its event name (`message` unless named) and its data lines joined (undefined with none). */
export function parseSseBlock(block: string): { comments: string[]; event: string; data: string | undefined } {
  let event = "message";
  const comments: string[] = [];
  const data: string[] = [];
  for (const line of block.split("\n")) {
    if (line.startsWith(":")) comments.push(line.slice(1).trim());
    else if (line.startsWith("event:")) event = line.slice(6).trim();
    else if (line.startsWith("data:")) data.push(line.slice(5).trimStart());
  }
  return { comments, event, data: data.length > 0 ? data.join("\n") : undefined };
}

/** The JSON `data:` payloads of a whole event-stream response, in order (the `[DONE]` end marker left out). */
export async function sseJson(res: Response): Promise<any[]> {
  const out: unknown[] = [];
  for (const block of (await res.text()).split("\n\n")) {
    const { data } = parseSseBlock(block);
    if (data !== undefined && data !== "[DONE]") out.push(JSON.parse(data));
  }
  return out;
}

export type SseItem = { event: string; data: unknown } | { comment: string };

/** A client of `GET /side-control/events`: fetch with the bearer header, events parsed as they arrive. */
export class EventStream {
  readonly items: SseItem[] = [];
  ended = false;
  private readonly abort: AbortController;
  private waiters: Array<() => void> = [];

  private constructor(abort: AbortController) {
    this.abort = abort;
  }

  /** Opens the stream; a refusal (status other than 200) is returned as the response instead. */
  static async open(
    baseUrl: string,
    bearer: string | undefined,
    headers: Record<string, string> = {},
    path = "/side-control/events",
  ): Promise<EventStream | Response> {
    const abort = new AbortController();
    const res = await fetch(`${baseUrl}${path}`, {
      headers: { ...(bearer ? { authorization: `Bearer ${bearer}` } : {}), ...headers },
      signal: abort.signal,
    });
    if (res.status !== 200 || !res.body) return res;
    const s = new EventStream(abort);
    s.pump(res.body).catch(() => {});
    return s;
  }

  static async must(baseUrl: string, bearer: string | undefined): Promise<EventStream> {
    const s = await EventStream.open(baseUrl, bearer);
    if (!(s instanceof EventStream)) throw new Error(`events refused: ${s.status} ${await s.text()}`);
    return s;
  }

  events(name?: string): Array<{ event: string; data: any }> {
    return this.items.filter((i): i is { event: string; data: any } => "event" in i && (name === undefined || i.event === name));
  }

  /** Waits until `check` holds over what arrived (or the stream ended, when `orEnd`). */
  async until<T>(check: (s: EventStream) => T | undefined | false, what: string, ms = 10_000): Promise<T> {
    const deadline = Date.now() + ms;
    for (;;) {
      const v = check(this);
      if (v) return v;
      if (this.ended) throw new Error(`the stream ended before ${what}; got ${JSON.stringify(this.items)}`);
      if (Date.now() > deadline) throw new Error(`timed out waiting for ${what}; got ${JSON.stringify(this.items)}`);
      await new Promise<void>((r) => {
        this.waiters.push(r);
        setTimeout(r, 200);
      });
    }
  }

  /** Waits for the server to end the stream. */
  async end(ms = 10_000): Promise<void> {
    const deadline = Date.now() + ms;
    while (!this.ended) {
      if (Date.now() > deadline) throw new Error(`the stream did not end; got ${JSON.stringify(this.items)}`);
      await new Promise<void>((r) => {
        this.waiters.push(r);
        setTimeout(r, 200);
      });
    }
  }

  close(): void {
    this.abort.abort();
  }

  private wake(): void {
    for (const w of this.waiters.splice(0)) w();
  }

  private async pump(body: ReadableStream<Uint8Array>): Promise<void> {
    try {
      for await (const block of sseBlocks(body)) {
        const { comments, event, data } = parseSseBlock(block);
        for (const comment of comments) this.items.push({ comment });
        if (data !== undefined) this.items.push({ event, data: JSON.parse(data) });
        this.wake();
      }
    } finally {
      this.ended = true;
      this.wake();
    }
  }
}
