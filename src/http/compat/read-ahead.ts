/**
 * Reads an engine's output ahead of the client, up to `maxBytes`: an engine's slot is then held
 * for as long as it takes to produce the result, not for as long as a slow client takes to read
 * it. Past `maxBytes` the engine waits for the client again (and the write timeout ends a client
 * that does not read at all).
 */
export function readAhead(source: AsyncIterator<Uint8Array>, maxBytes: number): AsyncIterator<Uint8Array> {
  const buffered: Uint8Array[] = [];
  let bytes = 0;
  let ended = false;
  let failure: { error: unknown } | undefined;
  let pumping = false;
  let stopped = false;
  let wake: (() => void) | undefined;
  const notify = () => {
    const w = wake;
    wake = undefined;
    w?.();
  };

  const pump = async () => {
    if (pumping || ended || stopped) return;
    pumping = true;
    try {
      while (!stopped && bytes < maxBytes) {
        const r = await source.next();
        if (r.done) {
          ended = true;
          break;
        }
        buffered.push(r.value);
        bytes += r.value.length;
        notify();
      }
    } catch (error) {
      failure = { error };
      ended = true;
    } finally {
      pumping = false;
      notify();
    }
  };
  void pump();

  return {
    async next(): Promise<IteratorResult<Uint8Array>> {
      for (;;) {
        const chunk = buffered.shift();
        if (chunk) {
          bytes -= chunk.length;
          void pump();
          return { done: false, value: chunk };
        }
        if (ended) {
          if (failure) {
            const { error } = failure;
            failure = undefined;
            throw error;
          }
          return { done: true, value: undefined };
        }
        void pump();
        await new Promise<void>((resolve) => {
          wake = resolve;
        });
      }
    },
    async return(): Promise<IteratorResult<Uint8Array>> {
      stopped = true;
      ended = true;
      buffered.length = 0;
      await source.return?.();
      return { done: true, value: undefined };
    },
  };
}
