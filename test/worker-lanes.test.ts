/**
 * Speech workers' lanes (issue 24) in process, with fake work (test/support/lane-worker.ts): a pool's
 * background workers run at a lower OS priority and take the jobs that are not urgent; urgent
 * (conversations') jobs take a foreground worker, even while every background one is busy, and
 * API jobs never do. Orders and counts, no timing. The real flite workers and recogniser processes
 * are checked in speech-load.test.ts.
 */
import assert from "node:assert/strict";
import { getPriority } from "node:os";
import { after, describe, test } from "node:test";
import { type JobClass, Scheduler } from "../src/ai/speech/scheduler.ts";
import { BACKGROUND_NICENESS, type PoolWorker, WorkerPool } from "../src/workers/pool.ts";
import type { LaneAnswer } from "./support/lane-worker.ts";

const script = new URL("./support/lane-worker.ts", import.meta.url);
const linux = process.platform === "linux";

/** A pool of `size` fake workers, `background` of them in the background, whose "hold" jobs answer once `release()` is called. */
async function lanes(size: number, background: number) {
  const gate = new Int32Array(new SharedArrayBuffer(4));
  const pool = new WorkerPool<string, LaneAnswer>({ script, workerData: gate, size, background, name: "test" });
  await pool.ready();
  const workers = pool.workers();
  const lane = (l: PoolWorker["lane"]) => new Set(workers.filter((w) => w.lane === l).map((w) => w.id));
  const release = () => {
    Atomics.store(gate, 0, 1);
    Atomics.notify(gate, 0);
  };
  return { pool, workers, foreground: lane("foreground"), background: lane("background"), release };
}

describe("worker pools of two nodes in one process", () => {
  test("each pool's warning (no OS priorities) goes to its own node's sink, once per pool: nothing set by the last pool made", async () => {
    const script = new URL("./support/no-tid-worker.ts", import.meta.url);
    const heard: Record<"a" | "b", string[]> = { a: [], b: [] };
    const a = new WorkerPool<string, string>({ script, size: 3, background: 2, name: "node a", warn: (m) => heard.a.push(m) });
    const b = new WorkerPool<string, string>({ script, size: 2, background: 1, name: "node b", warn: (m) => heard.b.push(m) });
    try {
      await Promise.all([a.ready(), b.ready()]);
      assert.equal(await a.run("x"), "x");
      assert.equal(heard.a.length, 1, "node a's pool warned its own sink once (two background workers)");
      assert.equal(heard.b.length, 1, "node b's pool warned its own sink");
      assert.match(heard.a[0]!, /^node a workers run without OS priorities/);
      assert.match(heard.b[0]!, /^node b workers run without OS priorities/);
    } finally {
      await Promise.all([a.close(), b.close()]);
    }
  });
});

describe("worker lanes: background work at a lower priority, conversations first", () => {
  const pools: Array<WorkerPool<string, LaneAnswer>> = [];
  after(async () => {
    await Promise.all(pools.map((p) => p.close()));
  });

  test("a background worker runs at a lower OS priority than a foreground one, read back by its thread id and from inside it", { skip: !linux }, async () => {
    const { pool, workers, release } = await lanes(2, 1);
    pools.push(pool);
    release();
    const base = getPriority();
    const expected = Math.min(19, base + BACKGROUND_NICENESS);
    const back = workers.find((w) => w.lane === "background")!;
    const front = workers.find((w) => w.lane === "foreground")!;
    assert.ok(back.osId !== undefined && front.osId !== undefined, "a worker says its thread id");
    assert.notEqual(back.osId, process.pid);
    assert.equal(getPriority(back.osId), expected);
    assert.equal(getPriority(front.osId), base);
    // The work itself runs at it: a job that is not urgent, on the background worker.
    const answer = await pool.run("api");
    assert.equal(answer.tid, back.osId);
    assert.equal(answer.niceness, expected);
    assert.equal((await pool.run("conversation", { urgent: true })).niceness, base);
  });

  test("a background process is lowered whole once ready: a thread it started before, back at the default priority, is lowered too", {
    skip: !linux || process.getuid?.() !== 0 ? "needs Linux and root (only root may raise a thread's priority back)" : false,
  }, async () => {
    const pool = new WorkerPool<string, number[]>({
      script: new URL("./support/lane-process-worker.ts", import.meta.url),
      size: 2,
      background: 1,
      isolation: "process",
      name: "test",
    });
    try {
      await pool.ready();
      const niceness = await pool.run("threads");
      assert.ok(niceness.length > 1, "the process has threads");
      assert.deepEqual(new Set(niceness), new Set([Math.min(19, getPriority() + BACKGROUND_NICENESS)]), `threads at ${niceness.join(", ")}`);
    } finally {
      await pool.close();
    }
  });

  test("API jobs never take a foreground worker: one waits while the foreground worker is free, and a conversation's job passes it", async () => {
    const { pool, foreground, background, release } = await lanes(2, 1);
    pools.push(pool);
    const first = await pool.run("conversation first", { urgent: true });
    assert.ok(foreground.has(first.threadId), "an urgent job prefers the foreground worker");
    const held = pool.run("hold api 1");
    const waiting = pool.run("api 2");
    try {
      assert.equal(pool.waiting, 1, "the second API job waits although the foreground worker is free");
      const urgent = await pool.run("conversation", { urgent: true });
      assert.ok(foreground.has(urgent.threadId));
      assert.equal(pool.waiting, 1, "the API job still waits, behind the background worker");
    } finally {
      release();
    }
    for (const answer of await Promise.all([held, waiting])) assert.ok(background.has(answer.threadId), `${answer.name} ran in the background`);
  });

  test("the engine's scheduler and pool together: a conversation's job starts on a foreground worker while every background worker is busy", async () => {
    const { pool, foreground, background, release } = await lanes(3, 2);
    pools.push(pool);
    // As the speech engine composes them: the foreground workers are the scheduler's reserved slots.
    const scheduler = new Scheduler({ name: "test", slots: 3, initialJobMs: 10, reserved: () => 1 });
    const started: string[] = [];
    const finished: string[] = [];
    const job = (name: string, cls: JobClass, caller = "a") =>
      scheduler
        .run(
          () => {
            started.push(name);
            return pool.run(name, { urgent: cls === "conversation" });
          },
          { class: cls, caller },
        )
        .then((answer) => {
          finished.push(name);
          return answer;
        });
    const api = ["hold a1", "hold b1", "hold a2", "hold b2"].map((name) => job(name, "api", name.at(-2)));
    try {
      assert.deepEqual(started, ["hold a1", "hold b1"], "API jobs take the background workers only");
      const turn = job("turn", "conversation");
      assert.deepEqual(started, ["hold a1", "hold b1", "turn"], "the turn started at once");
      assert.equal(pool.waiting, 0, "a worker took it at once");
      const conversation = await turn;
      assert.ok(foreground.has(conversation.threadId), "the turn ran on the foreground worker");
      assert.deepEqual(finished, ["turn"], "the turn was answered while both API jobs held the background workers");
    } finally {
      release();
    }
    for (const answer of await Promise.all(api)) assert.ok(background.has(answer.threadId), `${answer.name} ran in the background`);
    assert.equal(scheduler.busy, 0);
  });
});
