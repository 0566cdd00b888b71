/**
 * The embedded engines' scheduler (src/ai/speech/scheduler.ts) in process: fake jobs that finish
 * when the test says, a fake clock, no sleeps. The real engines behind it are tested in
 * speech-load.test.ts.
 */
import assert from "node:assert/strict";
import { describe, test } from "node:test";
import { OverloadedError, Scheduler, type SchedulerClock } from "../src/ai/speech/scheduler.ts";

class FakeClock implements SchedulerClock {
  time = 0;
  private timers: Array<{ at: number; fn: () => void; id: number }> = [];
  private ids = 0;
  now(): number {
    return this.time;
  }
  setTimeout(fn: () => void, ms: number): unknown {
    const id = ++this.ids;
    this.timers.push({ at: this.time + ms, fn, id });
    return id;
  }
  clearTimeout(handle: unknown): void {
    this.timers = this.timers.filter((t) => t.id !== handle);
  }
  advance(ms: number): void {
    this.time += ms;
    const due = this.timers.filter((t) => t.at <= this.time);
    this.timers = this.timers.filter((t) => t.at > this.time);
    for (const t of due) t.fn();
  }
  get pending(): number {
    return this.timers.length;
  }
}

/** Every promise callback already due has run (no time passes). */
const settled = () => new Promise<void>((resolve) => setImmediate(resolve));

/** Jobs that finish when told; `order` records which started. */
function harness(slots = 1, initialJobMs = 100) {
  const clock = new FakeClock();
  const scheduler = new Scheduler({ name: "test", slots, initialJobMs, clock });
  const order: string[] = [];
  const finishers = new Map<string, () => void>();
  const job = (name: string) => () => {
    order.push(name);
    return new Promise<string>((resolve) => finishers.set(name, () => resolve(name)));
  };
  /** Ends a running job and lets the scheduler start the next. */
  const finish = async (name: string, tookMs = 0) => {
    clock.advance(tookMs);
    const f = finishers.get(name);
    assert.ok(f, `${name} is not running`);
    f();
    await settled();
  };
  return { clock, scheduler, order, job, finish };
}

describe("engine scheduler", () => {
  test("conversations first, then the API, partials last; each class first come first served", async () => {
    const { scheduler, order, job, finish } = harness();
    const runs = [
      scheduler.run(job("api-1"), { class: "api", caller: "a" }),
      scheduler.run(job("partial"), { class: "partial" }),
      scheduler.run(job("api-2"), { class: "api", caller: "a" }),
      scheduler.run(job("conv-1"), { class: "conversation" }),
      scheduler.run(job("conv-2"), { class: "conversation" }),
    ];
    assert.deepEqual(order, ["api-1"]);
    assert.equal(scheduler.waiting, 4);
    for (const name of ["api-1", "conv-1", "conv-2", "api-2", "partial"]) await finish(name);
    assert.deepEqual(order, ["api-1", "conv-1", "conv-2", "api-2", "partial"]);
    assert.deepEqual(await Promise.all(runs), ["api-1", "partial", "api-2", "conv-1", "conv-2"]);
    assert.ok(scheduler.idleFor("api"));
  });

  test("callers take turns: one with 12 jobs waiting gets no more than one with 1", async () => {
    const { scheduler, order, job, finish } = harness();
    const many = Array.from({ length: 12 }, (_, i) => scheduler.run(job(`a${i + 1}`), { class: "api", caller: "a" }));
    const one = scheduler.run(job("b1"), { class: "api", caller: "b" });
    const another = scheduler.run(job("c1"), { class: "api", caller: "c" });
    await finish("a1");
    await finish("b1");
    await finish("c1");
    for (let i = 2; i <= 12; i++) await finish(`a${i}`);
    assert.deepEqual(order.slice(0, 4), ["a1", "b1", "c1", "a2"]);
    await Promise.all([...many, one, another]);
  });

  test("a caller that comes back after a pause goes next, not behind the others' backlog", async () => {
    const { scheduler, order, job, finish } = harness();
    const runs = [
      scheduler.run(job("a1"), { class: "api", caller: "a" }),
      scheduler.run(job("a2"), { class: "api", caller: "a" }),
      scheduler.run(job("b1"), { class: "api", caller: "b" }),
      scheduler.run(job("b2"), { class: "api", caller: "b" }),
    ];
    await finish("a1");
    runs.push(scheduler.run(job("c1"), { class: "api", caller: "c" }));
    for (const name of ["b1", "c1", "a2", "b2"]) await finish(name);
    assert.deepEqual(order, ["a1", "b1", "c1", "a2", "b2"]);
    await Promise.all(runs);
  });

  test("admission: refused at once when the jobs ahead would take longer than the budget, with Retry-After from the queue", async () => {
    const { scheduler, job, finish, clock } = harness(2, 1000);
    // Two slots free: starts at once whatever the budget.
    const running = [scheduler.run(job("c1"), { class: "conversation", maxWaitMs: 1 }), scheduler.run(job("c2"), { class: "api", caller: "a" })];
    assert.equal(scheduler.estimate("conversation"), 500, "no slot free: half a job (two slots) before one frees");
    const waiting = Array.from({ length: 6 }, (_, i) => scheduler.run(job(`a${i}`), { class: "api", caller: "a" }));
    // A conversation's job, and a new caller's first one, wait only for the running ones.
    assert.equal(scheduler.estimate("conversation"), 500);
    assert.equal(scheduler.estimate("api", "b"), 500);
    assert.equal(scheduler.estimate("api", "a"), 3500);
    assert.equal(scheduler.estimate("partial"), 3500);
    const refused = scheduler.run(job("b1"), { class: "api", caller: "b", maxWaitMs: 499 });
    await assert.rejects(refused, (e: unknown) => e instanceof OverloadedError && e.retryAfter === 1);
    const late = scheduler.run(job("a-late"), { class: "api", caller: "a", maxWaitMs: 1000 });
    await assert.rejects(late, (e: unknown) => e instanceof OverloadedError && e.retryAfter === 3);
    assert.equal(scheduler.stats().api.refused, 2);
    // A conversation's job is refused only by its deadline, never by the estimate.
    const turn = scheduler.run(job("turn"), { class: "conversation", maxWaitMs: 1 });
    assert.equal(clock.pending, 1);
    clock.advance(1);
    await assert.rejects(turn, OverloadedError);
    assert.equal(clock.pending, 0, "a refused job leaves no timer");
    const admitted = scheduler.run(job("b2"), { class: "api", caller: "b", maxWaitMs: 1000 });
    assert.equal(clock.pending, 1, "an admitted job waits with a deadline");
    await finish("c1", 10);
    assert.equal(clock.pending, 0, "it started: no deadline any more");
    await finish("c2");
    for (let i = 0; i < 6; i++) await finish(`a${i}`);
    await finish("b2");
    await Promise.all([...running, ...waiting, admitted]);
  });

  test("a job still waiting at its deadline is refused then; the queue goes on", async () => {
    const { scheduler, order, job, finish, clock } = harness(1, 10);
    const running = scheduler.run(job("long"), { class: "api", caller: "a" });
    const conversation = scheduler.run(job("turn"), { class: "conversation", maxWaitMs: 2000 });
    const next = scheduler.run(job("next"), { class: "api", caller: "a" });
    clock.advance(1999);
    assert.equal(scheduler.waiting, 2);
    clock.advance(1);
    await assert.rejects(conversation, OverloadedError);
    assert.equal(scheduler.waiting, 1);
    assert.equal(scheduler.stats().conversation.refused, 1);
    await finish("long");
    await finish("next");
    assert.deepEqual(order, ["long", "next"]);
    await Promise.all([running, next]);
  });

  test("an aborted job leaves the queue at once; one aborted before it is queued never enters", async () => {
    const { scheduler, order, job, finish } = harness();
    const running = scheduler.run(job("first"), { class: "api" });
    const controller = new AbortController();
    const aborted = scheduler.run(job("aborted"), { class: "api", signal: controller.signal });
    controller.abort(new Error("gone"));
    await assert.rejects(aborted, /gone/);
    await assert.rejects(scheduler.run(job("never"), { class: "api", signal: controller.signal }), /gone/);
    assert.equal(scheduler.waiting, 0);
    await finish("first");
    assert.deepEqual(order, ["first"]);
    await running;
  });

  test("a failing job fails only its caller and frees its slot; the mean job time follows what jobs take", async () => {
    const { scheduler, order, finish, job } = harness(1, 100);
    const failing = scheduler.run(() => Promise.reject(new Error("boom")), { class: "api" });
    const thrown = scheduler.run(
      () => {
        throw new Error("sync boom");
      },
      { class: "api" },
    );
    const after = scheduler.run(job("after"), { class: "api" });
    await assert.rejects(failing, /boom/);
    await assert.rejects(thrown, /sync boom/);
    await settled();
    assert.deepEqual(order, ["after"]);
    await finish("after", 600);
    await after;
    assert.ok(scheduler.jobMs > 100, `mean ${scheduler.jobMs}`);
  });

  test("stats: depth, oldest wait, jobs started and seconds waited per class", async () => {
    const { scheduler, job, finish, clock } = harness();
    const runs = [scheduler.run(job("x"), { class: "api", caller: "a" }), scheduler.run(job("y"), { class: "api", caller: "b" })];
    clock.advance(250);
    let stats = scheduler.stats();
    assert.equal(stats.api.depth, 1);
    assert.equal(stats.api.oldestWait, 0.25);
    assert.equal(stats.api.started, 1);
    await finish("x");
    stats = scheduler.stats();
    assert.equal(stats.api.depth, 0);
    assert.equal(stats.api.started, 2);
    assert.equal(stats.api.waited, 0.25);
    assert.equal(stats.conversation.started, 0);
    await finish("y");
    await Promise.all(runs);
  });

  test("batching: waiting jobs of a batched class run together when they fit the first, up to the most a batch takes", async () => {
    const clock = new FakeClock();
    const batches: number[][] = [];
    const finishers: Array<() => void> = [];
    const scheduler = new Scheduler({
      name: "batched",
      slots: 1,
      initialJobMs: 100,
      clock,
      batching: {
        classes: ["conversation"],
        max: 4,
        fits: (a, b) => Math.max(a as number, b as number) <= 2 * Math.min(a as number, b as number),
        run: (payloads) => {
          batches.push(payloads as number[]);
          return new Promise((resolve) => finishers.push(() => resolve((payloads as number[]).map((p) => p * 10))));
        },
      },
    });
    const first = scheduler.runBatched<number, number>(10, { class: "conversation" });
    const waiting = [12, 30, 11, 9, 10].map((n) => scheduler.runBatched<number, number>(n, { class: "conversation" }));
    // Five wait: two batches' worth, at the mean time of a run, after the one running.
    assert.equal(scheduler.estimate("conversation"), 300);
    const api = scheduler.runBatched<number, number>(12, { class: "api" });
    finishers.shift()!();
    await settled();
    assert.deepEqual(batches, [[10], [12, 11, 9, 10]]);
    finishers.shift()!();
    await settled();
    finishers.shift()!();
    await settled();
    finishers.shift()!();
    assert.deepEqual(batches, [[10], [12, 11, 9, 10], [30], [12]], "one that does not fit waits its own turn; another class is never batched in");
    assert.deepEqual(await Promise.all([first, ...waiting, api]), [100, 120, 300, 110, 90, 100, 120]);
    assert.equal(scheduler.runs, 4);
    assert.equal(scheduler.stats().conversation.started, 6);
  });

  /**
   * One slot, batches of 2, the fast mode when a job would be done more than 600 ms after it was
   * asked for (400 ms a batch at first); each run waits for `end(tookMs)`, which moves the clock.
   */
  function degrading() {
    const clock = new FakeClock();
    const runs: Array<{ payloads: number[]; fast: boolean }> = [];
    const finishers: Array<() => void> = [];
    const scheduler = new Scheduler({
      name: "degrading",
      slots: 1,
      initialJobMs: 400,
      clock,
      batching: {
        classes: ["conversation"],
        max: 2,
        fits: () => true,
        fastAfterMs: 600,
        run: (payloads, _cls, fast) => {
          runs.push({ payloads: payloads as number[], fast });
          return new Promise((resolve) => finishers.push(() => resolve(payloads)));
        },
      },
    });
    const end = async (tookMs: number) => {
      clock.advance(tookMs);
      finishers.shift()!();
      await settled();
    };
    return { scheduler, runs, end };
  }

  test("degradation: under a long queue a conversation batch runs in the fast mode, a short queue's on the full model; only full conversation batches measure it", async () => {
    const { scheduler, runs, end } = degrading();
    // Alone: done 400 ms after it was asked for, within 600.
    const jobs = [scheduler.runBatched<number, number>(1, { class: "conversation" })];
    // Two more wait behind it: they would be done 800 ms after they were asked for.
    jobs.push(...[2, 3].map((n) => scheduler.runBatched<number, number>(n, { class: "conversation" })));
    await end(400);
    await end(150);
    assert.deepEqual(runs, [
      { payloads: [1], fast: false },
      { payloads: [2, 3], fast: true },
    ]);
    assert.equal(scheduler.jobMs, 400, "a fast run's 150 ms is not the full model's time");
    assert.equal(scheduler.stats().conversation.degraded, 2);
    // Each batch alone in time, but the batch behind the next one would be late: the next one goes fast too.
    const blocker = scheduler.runBatched<number, number>(0, { class: "api" });
    jobs.push(...[4, 5, 6, 7].map((n) => scheduler.runBatched<number, number>(n, { class: "conversation" })));
    await end(100);
    // At 400 ms a batch (the api job's 100 ms is not a conversation batch's): [4, 5] would be done 500 ms after they were asked for, [6, 7] behind them 900 ms.
    assert.deepEqual(runs.slice(2), [
      { payloads: [0], fast: false },
      { payloads: [4, 5], fast: true },
    ]);
    await end(50);
    await end(50);
    assert.deepEqual(runs.at(-1), { payloads: [6, 7], fast: false }, "the last batch, alone now, is in time on the full model");
    assert.deepEqual(await Promise.all([...jobs, blocker]), [1, 2, 3, 4, 5, 6, 7, 0]);
    // Another class is never degraded, however long its queue.
    const api = [8, 9, 10, 11].map((n) => scheduler.runBatched<number, number>(n, { class: "api", caller: "a" }));
    for (let i = 0; i < 4; i++) await end(1000);
    await Promise.all(api);
    assert.ok(runs.slice(5).every((r) => !r.fast));
    assert.equal(scheduler.stats().api.degraded, 0);
    // Long api jobs made the mean job long; a lone turn after them is still measured by turns' batches.
    const lone = scheduler.runBatched<number, number>(12, { class: "conversation" });
    assert.deepEqual(runs.at(-1), { payloads: [12], fast: false });
    await end(100);
    assert.equal(await lone, 12);
  });

  test("degradation ends: a full-model mean measured under load comes down as fast batches get quicker, and a lone turn goes back to the full model", async () => {
    const { scheduler, runs, end } = degrading();
    /** One turn alone (nothing queued): whether it ran fast, once it took `tookMs`. */
    const lone = async (tookMs: number) => {
      const job = scheduler.runBatched<number, number>(1, { class: "conversation" });
      await end(tookMs);
      await job;
      return runs.at(-1)!.fast;
    };
    assert.equal(await lone(1500), false, "the full model, measured slow (the mean is now 620 ms)");
    assert.equal(await lone(500), true, "alone, yet late by the full model's mean");
    assert.equal(await lone(100), true, "the fast model five times quicker than its mean: the load is gone");
    assert.equal(await lone(100), false, "back on the full model");
  });

  test("a failing batch fails every job in it, and only those", async () => {
    const clock = new FakeClock();
    let fail = true;
    const scheduler = new Scheduler({
      name: "batched",
      slots: 1,
      initialJobMs: 100,
      clock,
      batching: { classes: ["conversation"], max: 4, fits: () => true, run: async (p) => (fail ? Promise.reject(new Error("crashed")) : p) },
    });
    let open!: () => void;
    const gate = scheduler.run(() => new Promise<void>((resolve) => (open = resolve)), { class: "api" });
    const batch = [1, 2].map((n) => scheduler.runBatched<number, number>(n, { class: "conversation" }));
    open();
    await gate;
    for (const job of batch) await assert.rejects(job, /crashed/);
    fail = false;
    assert.equal(await scheduler.runBatched<number, number>(3, { class: "conversation" }), 3);
  });

  test("slots kept for conversations: other jobs never take the last free one, a conversation's job starts at once beside them", async () => {
    const clock = new FakeClock();
    let reserved = 1;
    const scheduler = new Scheduler({ name: "test", slots: 2, initialJobMs: 100, clock, reserved: () => reserved });
    const order: string[] = [];
    const finishers = new Map<string, () => void>();
    const job = (name: string) => () => {
      order.push(name);
      return new Promise<string>((resolve) => finishers.set(name, () => resolve(name)));
    };
    const file1 = scheduler.run(job("file1"), { class: "api" });
    await settled();
    // Speculative work asks before it asks for a slot: with the free slot kept, only a conversation's
    // job would start now, so a partial is not queued for the final transcript to wait on.
    assert.deepEqual(
      [scheduler.idleFor("conversation"), scheduler.idleFor("api"), scheduler.idleFor("partial")],
      [true, false, false],
      "only a conversation's job would start",
    );
    const file2 = scheduler.run(job("file2"), { class: "api" });
    const partial = scheduler.run(job("partial"), { class: "partial" });
    await settled();
    assert.deepEqual(order, ["file1"], "one slot is kept");
    // Jobs of other classes waiting do not go before a conversation's: its speculative work may still start.
    assert.deepEqual([scheduler.idleFor("conversation"), scheduler.idleFor("partial")], [true, false]);
    assert.ok(scheduler.estimate("api") > 0, "an API job would wait");
    assert.equal(scheduler.estimate("conversation"), 0, "a conversation's would not");
    const turn = scheduler.run(job("turn"), { class: "conversation" });
    await settled();
    assert.deepEqual(order, ["file1", "turn"]);
    finishers.get("turn")!();
    await turn;
    await settled();
    assert.deepEqual(order, ["file1", "turn"], "the freed slot is kept again");
    finishers.get("file1")!();
    await file1;
    await settled();
    assert.deepEqual(order, ["file1", "turn", "file2"]);
    // No conversation any more: every slot serves the others.
    reserved = 0;
    finishers.get("file2")!();
    await file2;
    await settled();
    assert.deepEqual(order, ["file1", "turn", "file2", "partial"]);
    const file3 = scheduler.run(job("file3"), { class: "api" });
    await settled();
    assert.deepEqual(order, ["file1", "turn", "file2", "partial", "file3"], "both slots run");
    finishers.get("partial")!();
    finishers.get("file3")!();
    await Promise.all([partial, file3]);
  });

  test("a single slot is never kept: with one slot, reserved or not, other jobs run", async () => {
    const scheduler = new Scheduler({ name: "test", slots: 1, initialJobMs: 100, clock: new FakeClock(), reserved: () => 1 });
    assert.equal(await scheduler.run(async () => "ran", { class: "api" }), "ran");
  });
});
