/**
 * Callbacks that run outside any request (timers, the WebRTC library's native callbacks, stream
 * events) have no caller to catch what they throw: a throw there ends the process, and every
 * device on the node loses its connection. Each such callback is wrapped with `guarded`, whose
 * `onFailure` closes only what the callback belonged to (its stream, its channel, its connection).
 */
export function guarded<A extends unknown[]>(onFailure: (err: unknown) => void, fn: (...args: A) => unknown): (...args: A) => void {
  // One closure a callback (about a dozen a connection): the failure path allocates only when taken.
  return (...args: A) => {
    try {
      const result = fn(...args);
      if (result instanceof Promise) result.catch((err: unknown) => report(onFailure, err));
    } catch (err) {
      report(onFailure, err);
    }
  };
}

function report(onFailure: (err: unknown) => void, err: unknown): void {
  try {
    onFailure(err);
  } catch {
    // The failure handler closes things that may already be gone; nothing is left to do.
  }
}

/** Starts `work` without waiting for it: a rejection goes to `onFailure` instead of ending the process. */
export function detached(work: Promise<unknown>, onFailure: (err: unknown) => void): void {
  work.catch((err) => {
    try {
      onFailure(err);
    } catch {}
  });
}
