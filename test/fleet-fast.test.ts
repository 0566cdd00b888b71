import assert from "node:assert/strict";
import { describe, test } from "node:test";
import { generateKeyPair } from "../src/crypto/keys.ts";
import { DomainError } from "../src/domain/errors.ts";
import { Fleet } from "../src/node/fleet.ts";
import { StayConnected } from "../src/sdk/reconnect.ts";
import { OfferError } from "../src/sdk/webrtc.ts";

/** The admission's bounds in process (fleet.md §2): no server, a load the test sets. */
function fleet(bounds: { max_connections?: number; max_conversations?: number; max_cpu?: number }) {
  const load = { connections: 0, conversations: 0, cpu: 0 };
  const f = new Fleet({ max_connections: 0, max_conversations: 0, max_cpu: 0, drain_timeout_s: 300, ...bounds } as ConstructorParameters<typeof Fleet>[0], {
    counts: () => load,
    cpu: () => load.cpu,
    cores: 2,
  });
  return { f, load };
}

const refusal = (f: Fleet) => {
  try {
    f.admit();
    return undefined;
  } catch (err) {
    assert.ok(err instanceof DomainError, String(err));
    return { code: err.code, retryAfter: err.retryAfter };
  }
};

describe("fleet admission in process", () => {
  for (const counter of ["connections", "conversations"] as const) {
    test(`max_${counter} 20: full at 20, still full at 19 (the margin), serving at 18`, () => {
      const { f, load } = fleet({ [`max_${counter}`]: 20 });
      load[counter] = 19;
      assert.equal(f.state(), "serving");
      load[counter] = 20;
      assert.equal(f.state(), "full");
      assert.equal(refusal(f)?.code, "NODE_FULL");
      assert.ok((refusal(f)?.retryAfter ?? 0) >= 1);
      load[counter] = 19;
      assert.equal(f.state(), "full", "no flapping just under the bound");
      load[counter] = 18;
      assert.equal(f.state(), "serving");
      assert.equal(refusal(f), undefined);
    });
  }

  test("a drain refuses with NODE_DRAINING and Retry-After 1, whatever the load, for good", () => {
    const { f, load } = fleet({ max_connections: 5 });
    load.connections = 5;
    assert.equal(f.state(), "full");
    f.startDraining();
    assert.deepEqual(refusal(f), { code: "NODE_DRAINING", retryAfter: 1 });
    load.connections = 0;
    assert.equal(f.state(), "draining");
    assert.equal(f.report().state, "draining");
  });
});

describe("the SDK's reconnect in process", () => {
  test("a Retry-After past what a timer holds is waited out (bounded), not retried at once", async () => {
    let calls = 0;
    const device = new StayConnected({
      baseUrl: "http://127.0.0.1:9",
      keyPair: generateKeyPair(),
      log: () => {},
      connect: async () => {
        calls++;
        throw new OfferError(503, "NODE_FULL", "full", new Headers({ "retry-after": "99999999999" }));
      },
    });
    // Node fires a timer past 2^31 - 1 ms after 1 ms: unbounded, this was hundreds of attempts.
    await new Promise((resolve) => setTimeout(resolve, 300));
    assert.equal(calls, 1);
    await device.close();
  });

  test("a 503's Retry-After is a floor: its jitter only adds (at the lowest jitter, 1 s after Retry-After: 1, not 0.8 s)", async () => {
    const log: Array<{ event: string; delay_ms?: number; after?: string }> = [];
    let calls = 0;
    let device: { close(): Promise<void> } | undefined;
    const retried = new Promise<void>((resolve) => {
      device = new StayConnected({
        baseUrl: "http://127.0.0.1:9",
        keyPair: generateKeyPair(),
        random: () => 0,
        log: (e) => log.push(e),
        connect: async () => {
          calls++;
          if (calls === 2) resolve();
          throw new OfferError(503, "NODE_FULL", "full", new Headers({ "retry-after": "1" }));
        },
      });
    });
    await retried;
    await device!.close();
    const second = log.filter((e) => e.event === "attempt")[1]!;
    assert.deepEqual({ after: second.after, delay_ms: second.delay_ms }, { after: "refused", delay_ms: 1000 });
  });
});
