/** Where an embedded engine's loading stands (`perch_engine_state` of `/metrics`). */
import { EngineLoadError } from "./errors.ts";

/** Not started (nothing asked for it yet: not a failure), under way, done, or failed for good (a model that cannot load). */
export const LOAD_STATES = ["not_loaded", "loading", "ready", "failed"] as const;
export type LoadState = (typeof LOAD_STATES)[number];

/** A load under way, and where it stands. */
export class Loading {
  state: LoadState = "loading";
  readonly done: Promise<void>;

  constructor(work: Promise<void>) {
    this.done = work.then(
      () => {
        this.state = "ready";
      },
      (err: unknown) => {
        this.state = "failed";
        throw err;
      },
    );
    this.done.catch(() => {});
  }
}

/** What a failed load tells: the engine, its model, why, and when it is tried again. */
export interface LoadFailure {
  engine: string;
  model: string;
  err: unknown;
  retryInMs: number;
}

/**
 * A load that may fail and is then tried again with back-off (5 s doubling to 5 min), on the next
 * use after the wait: until then every use fails at once with `EngineLoadError` (a 503 naming the
 * engine and its model), and `failed` is called once per failed attempt (the node logs it).
 */
export class RetriedLoad {
  private current: Loading | undefined;
  private failures = 0;
  private retryAt = 0;
  private error: EngineLoadError | undefined;
  private stopCurrent: (() => void) | undefined;
  /** Attempts made (tests). */
  attempts = 0;
  failed: ((f: LoadFailure) => void) | undefined;
  private readonly o: {
    engine: string;
    model: string;
    /** Starts one attempt: `ready` settles with it; `stop` ends what it started (after a failure). */
    start(): { ready: Promise<void>; stop(): void };
    firstRetryMs?: number;
    maxRetryMs?: number;
    now?: () => number;
  };

  constructor(o: RetriedLoad["o"]) {
    this.o = o;
  }

  get state(): LoadState {
    return this.current?.state ?? "not_loaded";
  }

  /** Resolves once loaded: starts the load (again, once its back-off has passed); rejects with `EngineLoadError`. */
  ensure(): Promise<void> {
    const now = this.o.now ?? performance.now.bind(performance);
    if (this.current?.state === "failed") {
      if (now() < this.retryAt) return Promise.reject(this.error);
      this.current = undefined;
    }
    if (!this.current) {
      this.attempts++;
      const { ready, stop } = this.o.start();
      this.stopCurrent = stop;
      this.current = new Loading(
        ready.then(
          () => {
            this.failures = 0;
          },
          (err: unknown) => {
            const retryInMs = Math.min(this.o.maxRetryMs ?? 300_000, (this.o.firstRetryMs ?? 5_000) * 2 ** this.failures);
            this.failures++;
            this.retryAt = now() + retryInMs;
            this.error = new EngineLoadError(this.o.engine, this.o.model, err, retryInMs);
            this.stopCurrent?.();
            this.stopCurrent = undefined;
            try {
              this.failed?.({ engine: this.o.engine, model: this.o.model, err, retryInMs });
            } catch {}
            throw this.error;
          },
        ),
      );
    }
    return this.current.done;
  }

  /** Ends what the current attempt started (the engine closing). */
  stop(): void {
    this.stopCurrent?.();
    this.stopCurrent = undefined;
  }
}
