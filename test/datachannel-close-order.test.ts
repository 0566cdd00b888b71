/**
 * node-datachannel hands a channel's messages and its close to JavaScript through separate queues,
 * and after the close's callback it discards the channel's messages not yet delivered. When both
 * are waiting in one turn of the event loop (a busy loop: load, a large transfer beside it), the
 * queue registered first runs first: the device's channel must have its messages' queue ahead of
 * its close's, or the last message before a close (an RPC answer, an HTTP response) is lost.
 */
import assert from "node:assert/strict";
import { test } from "node:test";
import nodeDataChannel, { type DataChannel } from "node-datachannel";
import { NativeChannel } from "../src/sdk/datachannel.ts";
import { eventually } from "./support/webrtc.ts";

function pair() {
  const a = new nodeDataChannel.PeerConnection("close-order-a", { iceServers: [] });
  const b = new nodeDataChannel.PeerConnection("close-order-b", { iceServers: [] });
  a.onLocalDescription((sdp, type) => b.setRemoteDescription(sdp, type));
  a.onLocalCandidate((c, mid) => b.addRemoteCandidate(c, mid));
  b.onLocalDescription((sdp, type) => a.setRemoteDescription(sdp, type));
  b.onLocalCandidate((c, mid) => a.addRemoteCandidate(c, mid));
  return { a, b };
}

/** Holds the event loop for `ms` (what load does to it). */
function busy(ms: number): void {
  const until = performance.now() + ms;
  while (performance.now() < until) {}
}

test("a message sent right before the close is delivered when both wait in the same turn of the event loop", async () => {
  const { a, b } = pair();
  try {
    const received: string[] = [];
    const channels: NativeChannel[] = [];
    b.onDataChannel((native) => {
      const dc = new NativeChannel(native);
      dc.onmessage = (e) => received.push(String(e.data));
      channels.push(dc);
    });
    for (let round = 0; round < 5; round++) {
      const sender: DataChannel = a.createDataChannel(`round-${round}`);
      await eventually(() => sender.isOpen() && channels.length === round + 1, 10_000, "the channel open on both sides");
      sender.sendMessage(`last words ${round}`);
      sender.close();
      // The message and the close both reach the receiver while its loop is held.
      busy(300);
      const dc = channels[round]!;
      await eventually(() => dc.readyState === "closed", 10_000, "the receiver's channel closed");
      await new Promise((r) => setTimeout(r, 50));
      assert.ok(received.includes(`last words ${round}`), `round ${round}: the message before the close was lost (received: ${JSON.stringify(received)})`);
    }
  } finally {
    a.close();
    b.close();
  }
});
