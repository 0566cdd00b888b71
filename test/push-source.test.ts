/**
 * The fast layer: `PushSource`, the queue in front of the one stream writer for events pushed as
 * they happen (Side Control's): pieces in order, a client too far behind fails the stream, the
 * client's leaving is heard once.
 */
import assert from "node:assert/strict";
import { test } from "node:test";
import { PushSource } from "../src/http/stream.ts";

const bytes = (n: number, fill = 1) => new Uint8Array(n).fill(fill);

test("pieces come out in the order pushed, queued or awaited, then the end", async () => {
  const source = new PushSource(1024);
  source.push(bytes(1, 1));
  source.push(bytes(1, 2));
  assert.deepEqual((await source.next()).value, bytes(1, 1));
  assert.deepEqual((await source.next()).value, bytes(1, 2));
  const waiting = source.next();
  source.push(bytes(1, 3));
  assert.deepEqual((await waiting).value, bytes(1, 3));
  source.push(bytes(1, 4));
  source.end();
  assert.deepEqual((await source.next()).value, bytes(1, 4), "what was queued before the end is still written");
  assert.equal((await source.next()).done, true);
  source.push(bytes(1, 5));
  assert.equal((await source.next()).done, true, "nothing after the end");
});

test("a client more than the backlog behind fails the stream: the push throws and the writer's next read fails", async () => {
  const source = new PushSource(100);
  source.push(bytes(60));
  assert.throws(() => source.push(bytes(60)), /reads too slowly/);
  await assert.rejects(source.next(), /reads too slowly/);
  source.push(bytes(1));
  await assert.rejects(source.next(), /reads too slowly/, "still failed");
});

test("pieces the writer took no longer count against the backlog", async () => {
  const source = new PushSource(100);
  for (let i = 0; i < 10; i++) {
    source.push(bytes(60));
    await source.next();
  }
  source.push(bytes(60));
});

test("the client's leaving (the writer's return) is heard once, and ends the source", async () => {
  const source = new PushSource(100);
  let left = 0;
  source.onReturn = () => left++;
  source.push(bytes(10));
  await source.return();
  await source.return();
  assert.equal(left, 1);
  assert.equal((await source.next()).done, true, "what was queued is dropped");
});
