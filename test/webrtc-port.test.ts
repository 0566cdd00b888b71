/**
 * The node's UDP port (every connection's, through the ICE mux) is bound at start and held for
 * the node's life: a port in use fails the start with its number, and between two devices no
 * other socket can take it (libjuice alone closes the mux with its last connection).
 */
import assert from "node:assert/strict";
import { createSocket, type Socket } from "node:dgram";
import { readdirSync, readFileSync, readlinkSync } from "node:fs";
import { after, describe, test } from "node:test";
import { freeUdpPort, startTestServer, type TestServer } from "./support/server.ts";
import { connect, eventually } from "./support/webrtc.ts";

function bindUdp(port: number): Promise<Socket> {
  return new Promise((resolve, reject) => {
    const socket = createSocket("udp4");
    socket.once("error", (err) => {
      socket.close();
      reject(err);
    });
    socket.bind(port, "127.0.0.1", () => resolve(socket));
  });
}

/**
 * Whether this process holds a socket bound to `port` (Linux). Child processes (the recognisers)
 * may hold copies of it, so whether the port can be bound again does not tell.
 */
function heldHere(port: number): boolean {
  const hex = `:${port.toString(16).toUpperCase().padStart(4, "0")}`;
  const inodes = new Set<string>();
  for (const table of ["/proc/net/udp", "/proc/net/udp6"]) {
    for (const line of readFileSync(table, "utf8").split("\n").slice(1)) {
      const fields = line.trim().split(/\s+/);
      if (fields[1]?.endsWith(hex)) inodes.add(fields[9]!);
    }
  }
  return readdirSync("/proc/self/fd").some((fd) => {
    try {
      return inodes.has(/^socket:\[(\d+)\]$/.exec(readlinkSync(`/proc/self/fd/${fd}`))?.[1] ?? "");
    } catch {
      return false;
    }
  });
}

describe("the node's UDP port", () => {
  let server: TestServer | undefined;
  after(async () => {
    await server?.stop();
  });

  test("a port in use fails the start, naming it", async () => {
    const port = await freeUdpPort();
    const taken = await bindUdp(port);
    try {
      await assert.rejects(startTestServer({ config: { webrtc: { udp_port: port } } }), new RegExp(`cannot use UDP port ${port}`));
    } finally {
      taken.close();
    }
  });

  test("is held from the start, with no device and after the last one left; a device still connects after; let go when the node stops", async () => {
    const port = await freeUdpPort();
    server = await startTestServer({ config: { webrtc: { udp_port: port } } });
    assert.ok(heldHere(port), "bound by this process at start");
    await assert.rejects(bindUdp(port), /EADDRINUSE/, "held before any device");
    const first = await connect(server);
    first.close();
    await eventually(() => server!.transport!.size === 0, 10_000, "the connection closed at the node");
    await assert.rejects(bindUdp(port), /EADDRINUSE/, "held after the last device left");
    const second = await connect(server);
    assert.equal((await second.http(1, "GET", "/me")).status, 200);
    second.close();
    await server.stop();
    server = undefined;
    await eventually(() => !heldHere(port), 10_000, "the port let go when the node stopped");
  });
});
