/** Where an embedded engine's loading stands (`perch_engine_state` of `/metrics`). */

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
