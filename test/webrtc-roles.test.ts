import assert from "node:assert/strict";
import { after, before, describe, test } from "node:test";
import wrtc from "@roamhq/wrtc";
import type { ChannelPort } from "../src/protocol/channel.ts";
import { Answerer, type PeerLink } from "../src/transport/answerer.ts";
import { freeUdpPort } from "./support/server.ts";
import { answeredBy, eventually } from "./support/webrtc.ts";

/**
 * The DTLS role the answer takes (`a=setup`), which decides the parity of every DataChannel id
 * (RFC 8832: even for the DTLS client), over real connections: a `@roamhq/wrtc` device and the
 * server's own `Answerer`, channels opened by the device and by the server, both ways.
 */

/** The address of one of the offer's own UDP candidates (127.0.0.1 when it has one): an offer that reached the server with no NAT between. */
function ownAddress(offer: string): string {
  const addresses = [...offer.matchAll(/^a=candidate:\S+ \d+ udp \d+ (\S+) \d+ typ host/gim)].map((m) => m[1]!);
  const ipv4 = addresses.filter((a) => /^\d+\.\d+\.\d+\.\d+$/.test(a));
  const address = ipv4.find((a) => a === "127.0.0.1") ?? ipv4[0];
  assert.ok(address, "the device offers an IPv4 candidate");
  return address;
}

/** An address none of the offer's candidates has: a device behind a NAT, whose HTTP request comes from its NAT's address. */
const BEHIND_NAT = "203.0.113.7";

function setup(sdp: string): string | undefined {
  return /^a=setup:(\w+)/m.exec(sdp)?.[1];
}

/** Echoes every message of every channel the device opens, and records what arrives. */
function echoing(link: PeerLink, heard: string[]): void {
  link.onChannel((port: ChannelPort) =>
    port.attach({
      message: (data) => {
        heard.push(`${port.label}:${Buffer.from(data).toString()}`);
        port.send(data);
      },
      closed: () => {},
      failed: () => {},
      drained: () => {},
    }),
  );
}

function nextMessage(dc: RTCDataChannel): Promise<string> {
  return new Promise((resolve) => {
    dc.addEventListener("message", (e) => resolve(typeof e.data === "string" ? e.data : Buffer.from(e.data as ArrayBuffer).toString()), { once: true });
  });
}

describe("the answer's DTLS role: both roles connect, with channels opened by either side", () => {
  let answerer: Answerer;
  const closers: Array<() => void> = [];
  before(async () => {
    answerer = new Answerer({ udpPort: await freeUdpPort(), bindAddress: "127.0.0.1", publicAddress: undefined, gatherTimeoutMs: 5_000 });
    await answerer.hold();
  });
  after(() => {
    for (const close of closers) close();
    answerer.release();
  });

  const cases: Array<{ name: string; from: string | ((offer: string) => string); edit?: (offer: string) => string; answered: "active" | "passive" }> = [
    {
      name: "an offer (actpass) from one of its own candidates' addresses (checked at once): the server is the DTLS client",
      from: ownAddress,
      answered: "active",
    },
    { name: "an offer (actpass) from an address none of its candidates has: the server is the DTLS client", from: BEHIND_NAT, answered: "active" },
    {
      name: "an offer that says passive: the server is the DTLS client (RFC 8842)",
      from: BEHIND_NAT,
      edit: (offer) => offer.replace(/^a=setup:actpass/gm, "a=setup:passive"),
      answered: "active",
    },
    {
      name: "an offer that says active, checked at once: the server is the DTLS server, and opens odd channel ids",
      from: ownAddress,
      edit: (offer) => offer.replace(/^a=setup:actpass/gm, "a=setup:active"),
      answered: "passive",
    },
  ];

  for (const c of cases) {
    test(c.name, async () => {
      const pc = new wrtc.RTCPeerConnection({ iceServers: [] });
      const heard: string[] = [];
      let link: PeerLink | undefined;
      closers.push(() => {
        pc.close();
        link?.close();
      });
      pc.addTransceiver("audio", { direction: "sendrecv" });
      const deviceChannel = pc.createDataChannel("giznet/v1/service/32");
      const fromServer: RTCDataChannel[] = [];
      pc.ondatachannel = (e) => fromServer.push(e.channel);
      link = await answeredBy(answerer, pc, (l) => echoing(l, heard), { from: c.from, ...(c.edit ? { edit: c.edit } : {}) });
      assert.equal(setup(link.answer), c.answered, "the answer's a=setup");

      // The DTLS client opens even ids, the server odd ones: the device is the client when the server answers passive.
      const deviceParity = c.answered === "passive" ? 0 : 1;
      await eventually(() => deviceChannel.readyState === "open", 10_000, "the device's channel open");
      assert.equal(deviceChannel.id! % 2, deviceParity, `the device's channel id ${deviceChannel.id}`);
      const echoed = nextMessage(deviceChannel);
      deviceChannel.send("ping");
      assert.equal(await echoed, "ping");

      // Two channels the server opens (its id cycle), each used both ways.
      for (const label of ["giznet/v1/service/1000", "giznet/v1/service/1001"]) {
        const received: string[] = [];
        const port = await link.openChannel(label, 10_000);
        port.attach({ message: (data) => received.push(Buffer.from(data).toString()), closed: () => {}, failed: () => {}, drained: () => {} });
        const dc = await eventually(() => fromServer.find((d) => d.label === label), 10_000, `${label} at the device`);
        assert.equal(dc.id! % 2, 1 - deviceParity, `the server's channel id ${dc.id}`);
        const down = nextMessage(dc);
        port.send(Buffer.from("down"));
        assert.equal(await down, "down");
        dc.send("up");
        await eventually(() => received.includes("up"), 10_000, `${label}: the device's message at the server`);
      }
      assert.deepEqual(heard, ["giznet/v1/service/32:ping"]);
    });
  }
});
