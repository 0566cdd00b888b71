import assert from "node:assert/strict";
import { spawn } from "node:child_process";
import { writeFileSync } from "node:fs";
import { availableParallelism } from "node:os";
import { join } from "node:path";
import { after, describe, test } from "node:test";
import { Hono } from "hono";
import { encodeKey, generateKeyPair } from "../src/crypto/keys.ts";
import type { AppEnv } from "../src/http/env.ts";
import type { Surface } from "../src/http/surface.ts";
import { PerchClient } from "../src/sdk/client.ts";
import { type ReconnectLog, StayConnected } from "../src/sdk/reconnect.ts";
import { OfferError, type PerchConnection } from "../src/sdk/webrtc.ts";
import { perch, perchJson } from "./support/cli.ts";
import { ROOT, startTestServer, type TestServer, tempDir } from "./support/server.ts";
import { EventStream } from "./support/sse.ts";
import { EventLog } from "./support/voice.ts";
import { connect, eventually, within } from "./support/webrtc.ts";

/** Fleet contract §1–§4 on one SQLite node: its row, admission, drain and devices that come back. */

type NodeView = { name: string; state: string; endpoint: string | null; heartbeat_age_ms: number; connections: number; drain_requested: boolean };

const readyz = async (s: TestServer) => {
  const res = await s.request("/readyz");
  return { status: res.status, body: (await res.json()) as { status?: string; error?: { code: string } }, retryAfter: res.headers.get("retry-after") };
};

async function refusedOffer(s: TestServer): Promise<OfferError> {
  const err = await connect(s).then(
    (c) => {
      c.close();
      return undefined;
    },
    (e: unknown) => e,
  );
  assert.ok(err instanceof OfferError, `the offer was not refused: ${String(err)}`);
  return err;
}

describe("admission: a full node refuses new devices and keeps those it has", () => {
  const servers: TestServer[] = [];
  after(async () => {
    for (const s of servers) await s.stop();
  });

  test("at fleet.max_connections offers get 503 NODE_FULL with Retry-After and /readyz 503 full; below it again, it serves", async () => {
    const s = await startTestServer({ config: { fleet: { max_connections: 2, max_cpu: 0 } } });
    servers.push(s);
    assert.deepEqual((await readyz(s)).body, { status: "ok" });
    const a = await connect(s);
    assert.deepEqual((await readyz(s)).body, { status: "ok" });
    const b = await connect(s);
    const ready = await readyz(s);
    assert.equal(ready.status, 503);
    assert.deepEqual(ready.body, { status: "full" });
    const refused = await refusedOffer(s);
    assert.equal(refused.status, 503);
    assert.equal(refused.code, "NODE_FULL");
    assert.ok(Number(refused.headers.get("retry-after")) >= 1);
    // What is connected is never cut: both devices still answer, and use the node.
    assert.ok((await a.ping()).rttMs >= 0);
    assert.equal((await b.http(1, "GET", "/me")).status, 200);
    b.close();
    await eventually(async () => (await readyz(s)).status === 200, 5_000, "serving again after a device left");
    const c = await connect(s);
    a.close();
    c.close();
  });

  test("fleet.max_cpu is judged as a share of the cores over 5 s; a full node serves again only below the bound by a margin", async () => {
    const cores = availableParallelism();
    let cpu = 0.2 * cores;
    // The process's CPU is the operating system's to say: the test gives its own measure.
    const s = await startTestServer({ config: { fleet: { max_cpu: 0.5 } }, cpuShare: () => cpu });
    servers.push(s);
    assert.equal((await readyz(s)).status, 200);
    cpu = 0.5 * cores;
    assert.deepEqual((await readyz(s)).body, { status: "full" });
    assert.equal((await refusedOffer(s)).code, "NODE_FULL");
    // Just under the bound: still full (no flapping).
    cpu = 0.47 * cores;
    assert.deepEqual((await readyz(s)).body, { status: "full" });
    cpu = 0.44 * cores;
    assert.deepEqual((await readyz(s)).body, { status: "ok" });
    const c = await connect(s);
    c.close();
  });

  test("fleet.max_cpu 0 turns the CPU bound off", async () => {
    const s = await startTestServer({ config: { fleet: { max_cpu: 0 } }, cpuShare: () => 64 });
    servers.push(s);
    assert.deepEqual((await readyz(s)).body, { status: "ok" });
  });
});

describe("drain on one node", () => {
  test("SIGTERM's drain: /readyz 503 draining and offers 503 NODE_DRAINING at once, an idle device gets node.reconnect, the row says gone, the node closes", async () => {
    const dataDir = tempDir();
    const s = await startTestServer({ dataDir, config: { node_name: "solo", fleet: { max_cpu: 0 } } });
    const device = await connect(s);
    const log = new EventLog(device);
    // A phone watching the device: its event stream ends with the drain (its app reconnects through the balancer).
    const owner = new PerchClient({ baseUrl: s.url, keyPair: device.keyPair });
    await owner.login();
    const phone = s.client();
    await phone.login({ deviceToken: (await owner.createDeviceToken()).token });
    const stream = await EventStream.must(s.url, phone.accessToken);
    await stream.until((e) => e.events("status").length > 0, "the stream's first event");
    const draining = s.drain();
    // At once: no wait for the heartbeat or for the devices.
    assert.deepEqual((await readyz(s)).body, { status: "draining" });
    await log.wait((e) => e.label === "node.reconnect", 5_000, "node.reconnect");
    // Ended with the drain's start, not with the node's close a second later (the device keeps its connection until then).
    await stream.end(500);
    const event = log.all.find((e) => e.label === "node.reconnect")!;
    assert.equal(event.type, "TEXT_DONE");
    assert.equal(event.stream, "node");
    assert.deepEqual(JSON.parse(event.text!), { reason: "draining", retry_after_ms: 0 });
    await within(device.closed(), 5_000, "the connection closed");
    await within(draining, 10_000, "the drain finished");
    await within(s.finished, 1_000, "the node finished");
    const rows = await perchJson<NodeView[]>(["nodes", "--json"], { PERCH_DATA_DIR: dataDir });
    assert.equal(rows.length, 1);
    assert.equal(rows[0]!.name, "solo");
    assert.equal(rows[0]!.state, "gone");
    await s.stop();
  });

  test("a refused offer while draining is NODE_DRAINING with Retry-After: 1, before any check (no nonce spent)", async () => {
    const s = await startTestServer({ config: { fleet: { max_cpu: 0 } } });
    const held = await connect(s);
    // A device that never closes: the drain waits for its grace, the offer in between is refused.
    const draining = s.drain();
    const res = await fetch(`${s.url}/webrtc/v1/offer`, { method: "POST", headers: { "content-type": "text/plain" }, body: "x" });
    assert.equal(res.status, 503);
    assert.equal(res.headers.get("retry-after"), "1");
    assert.equal(((await res.json()) as { error: { code: string } }).error.code, "NODE_DRAINING");
    await within(draining, 10_000, "the drain finished");
    held.close();
    await s.stop();
  });

  test("perch nodes lists the node with its heartbeat's age and load; perch nodes drain reaches it through the store", async () => {
    const dataDir = tempDir();
    const s = await startTestServer({ dataDir, config: { node_name: "lab-1", public_endpoint: "lab-1.example:8080", fleet: { max_cpu: 0 } } });
    const device = await connect(s);
    const env = { PERCH_DATA_DIR: dataDir };
    // A node that died a minute ago: its row still says serving, its heartbeat says gone.
    await s.store.transaction((tx) => tx.nodes.start("lab-0", "lab-0.example:8080", Date.now() - 60_000));
    await eventually(
      async () => (await perchJson<NodeView[]>(["nodes", "--json"], env)).find((n) => n.name === "lab-1")?.connections === 1,
      10_000,
      "the heartbeat's load in the row",
    );
    const [ghost, row] = await perchJson<NodeView[]>(["nodes", "--json"], env);
    assert.equal(ghost!.name, "lab-0");
    assert.equal(ghost!.state, "gone");
    assert.ok(ghost!.heartbeat_age_ms >= 60_000);
    assert.equal(row!.state, "serving");
    assert.equal(row!.endpoint, "lab-1.example:8080");
    assert.ok(row!.heartbeat_age_ms >= 0 && row!.heartbeat_age_ms < 8_000);
    const table = await perch(["nodes"], env);
    assert.match(table.stdout, /^NAME\s+STATE/m);
    assert.match(table.stdout, /^lab-1\s+serving\s+lab-1\.example:8080/m);
    const unknown = await perch(["nodes", "drain", "nobody"], env);
    assert.equal(unknown.code, 1);
    assert.match(unknown.stderr, /no node nobody is serving/);
    // The node that died: shown gone, so not asked (its row's "serving" would take the request, and no one would read it).
    const dead = await perch(["nodes", "drain", "lab-0"], env);
    assert.equal(dead.code, 1, dead.stdout);
    assert.match(dead.stderr, /no node lab-0 is serving/);
    assert.deepEqual(await perchJson(["nodes", "drain", "lab-1"], env), { name: "lab-1", drain_requested: true });
    await within(s.finished, 15_000, "the node drained, asked through the store");
    await within(device.closed(), 5_000, "its device handed over");
    assert.equal((await perchJson<NodeView[]>(["nodes", "--json"], env))[1]!.state, "gone");
    await s.stop();
  });
});

describe("a drain answers what is in flight", () => {
  test("an HTTP request under way when the drain begins is answered, while a device is still being handed over; /readyz says draining meanwhile", async () => {
    let release: () => void = () => {};
    let arrived = false;
    const slow: Surface = {
      base: "/slow",
      app: new Hono<AppEnv>().get("/wait", async (c) => {
        arrived = true;
        await new Promise<void>((r) => (release = r));
        return c.json({ answered: true });
      }),
      failure: () => ({ status: 500, body: { error: "internal" }, contentType: "application/json" }),
      unrouted: (c) => c.json({ error: "not found" }, 404),
    };
    const s = await startTestServer({ surfaces: () => [slow], config: { fleet: { max_cpu: 0 } } });
    const device = await connect(s);
    const inFlight = fetch(`${s.url}/slow/wait`);
    await eventually(() => arrived, 5_000, "the request under way");
    const draining = s.drain();
    assert.equal((await fetch(`${s.url}/readyz`)).status, 503);
    let drained = false;
    void draining.then(() => (drained = true));
    // The device handed over, the node closing: the request is still answered, and the drain waits for it.
    await within(device.closed(), 5_000, "handed over");
    await new Promise((r) => setTimeout(r, 300));
    assert.equal(drained, false, "the drain waits for the request");
    release();
    const res = await within(inFlight, 5_000, "the answer");
    assert.equal(res.status, 200);
    assert.deepEqual(await res.json(), { answered: true });
    await within(draining, 10_000, "drained");
    await s.stop();
  });
});

describe("devices come back by themselves (fleet.md §4)", () => {
  test("after node.reconnect the SDK connects again to the same URL, backing off while no node answers", async () => {
    const dataDir = tempDir();
    const keyPair = generateKeyPair();
    const first = await startTestServer({ dataDir, config: { node_name: "restart", fleet: { max_cpu: 0 } } });
    const port = first.port;
    const log: ReconnectLog[] = [];
    const device = new StayConnected({ baseUrl: first.url, keyPair, log: (e) => log.push(e) });
    const conn1 = await device.connected();
    await first.drain();
    await first.stop();
    // The same address again, as a balancer's would be: the next node answers there.
    await eventually(() => log.some((e) => e.event === "failed" || e.event === "refused"), 10_000, "an attempt while no node serves");
    const second = await startTestServer({ dataDir, config: { port, node_name: "restart", fleet: { max_cpu: 0 } } });
    const conn2: PerchConnection = await within(
      eventually(async () => device.current !== conn1 && device.current, 20_000, "connected again"),
      25_000,
      "connected again",
    );
    assert.equal((await conn2.http(1, "GET", "/me")).json<{ public_key: string }>().public_key, encodeKey(keyPair.publicKey));
    assert.ok(log.some((e) => e.event === "reconnect" && e.reason === "draining"));
    const attempts = log.filter((e) => e.event === "attempt") as Array<Extract<ReconnectLog, { event: "attempt" }>>;
    assert.equal(attempts[1]!.after, "node.reconnect");
    assert.equal(attempts[1]!.delay_ms, 0);
    // After a refusal, never sooner than its Retry-After; after a failure, the back-off (0.5 s doubling to 10 s, ±20 %).
    for (let i = 2; i < attempts.length; i++) {
      const { after, delay_ms } = attempts[i]!;
      if (after === "refused") assert.ok(delay_ms >= 1000, `an attempt ${delay_ms} ms after a 503 with Retry-After: 1`);
      else assert.ok(after === "error" && delay_ms >= 400 && delay_ms <= 12_000, `attempt ${i}: ${after} ${delay_ms} ms`);
    }
    await device.close();
    await second.stop();
  });
});

describe("the SDK's back-off", () => {
  test("0.5 s doubling, with ±20 % jitter; a 503's Retry-After is waited out; a refusal no retry can fix stops the device", async () => {
    const s = await startTestServer({ config: { fleet: { max_cpu: 0 } } });
    const log: ReconnectLog[] = [];
    let calls = 0;
    const headers = new Headers({ "retry-after": "2" });
    const device = new StayConnected({
      baseUrl: s.url,
      keyPair: generateKeyPair(),
      // The lowest jitter: each delay is 80 % of its step.
      random: () => 0,
      log: (e) => log.push(e),
      // The network fails three times, then a node is full once, then the real connection.
      connect: async (o) => {
        calls++;
        if (calls <= 3) throw new Error("connect ECONNREFUSED");
        if (calls === 4) throw new OfferError(503, "NODE_FULL", "full", headers);
        return (await import("../src/sdk/webrtc.ts")).PerchConnection.connect(o);
      },
    });
    const conn = await within(device.connected(), 20_000, "connected");
    const delays = log.filter((e) => e.event === "attempt").map((e) => (e as { delay_ms: number }).delay_ms);
    // The refusal: the longer of its Retry-After (2 s, a floor: its jitter only adds) and the back-off (4 s, jittered).
    assert.deepEqual(delays, [0, 400, 800, 1600, 3200]);
    assert.ok(log.some((e) => e.event === "refused" && e.code === "NODE_FULL" && e.retry_after_s === 2));
    conn.close();
    await device.close();

    const blocked = new StayConnected({
      baseUrl: s.url,
      keyPair: generateKeyPair(),
      connect: async () => {
        throw new OfferError(403, "PEER_BLOCKED", "blocked", new Headers());
      },
    });
    await within(blocked.finished(), 5_000, "the device gave up");
    assert.equal(blocked.error?.code, "PEER_BLOCKED");
    await assert.rejects(blocked.connected(), /PEER_BLOCKED/);
    await s.stop();
  });
});

describe("perch device connect comes back by itself", () => {
  test("after node.reconnect it says so, tries again with back-off while no node answers, and is connected again on the next node", async () => {
    const dataDir = tempDir();
    const keyFile = join(tempDir(), "device.json");
    const pair = generateKeyPair();
    writeFileSync(keyFile, JSON.stringify({ public_key: encodeKey(pair.publicKey), private_key: encodeKey(pair.privateKey) }));
    const first = await startTestServer({ dataDir, config: { node_name: "cli-node", fleet: { max_cpu: 0 } } });
    const child = spawn(join(ROOT, "bin/perch"), ["device", "--server", first.url, "--key-file", keyFile, "connect", "--telemetry-interval", "0"], {
      stdio: ["ignore", "pipe", "pipe"],
    });
    let out = "";
    child.stdout.on("data", (c: Buffer) => (out += c.toString()));
    child.stderr.on("data", (c: Buffer) => (out += c.toString()));
    try {
      await eventually(() => /GET \/me over stream 1/.test(out), 30_000, "the device connected");
      const port = first.port;
      await first.drain();
      await first.stop();
      await eventually(() => /node\.reconnect received \{"reason":"draining","retry_after_ms":0\}/.test(out), 5_000, "the event said");
      await eventually(() => /reconnecting \{"attempt":2,"delay_ms":\d+,"after":"(error|refused)"\}/.test(out), 10_000, "attempts with back-off");
      const second = await startTestServer({ dataDir, config: { port, node_name: "cli-node", fleet: { max_cpu: 0 } } });
      try {
        await eventually(() => /reconnected \{"attempt":\d+,"after":"(error|refused)"/.test(out), 20_000, "connected again");
        await eventually(() => (out.match(/GET \/me over stream 1/g) ?? []).length === 2, 10_000, "set up again");
      } finally {
        child.kill("SIGINT");
        await new Promise((r) => child.once("exit", r));
        await second.stop();
      }
    } finally {
      if (child.exitCode === null) child.kill("SIGKILL");
    }
  });
});
