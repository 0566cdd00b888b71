import { CommandError, type Commands } from "../bus/index.ts";
import { DomainError } from "../domain/errors.ts";
import type { Domain } from "../domain/index.ts";
import type { WebRtcPort } from "../http/public/webrtc.ts";
import type { WebRtcTransport } from "../transport/transport.ts";

/**
 * How long a tone for a device on another node waits for that node: longer than the commands'
 * default 3 s, since a node that has just started warms its speech engines on both cores (a tone
 * asked then was refused 409 in a test run); only the request that asked for the tone waits.
 */
const TONE_COMMAND_TIMEOUT_MS = 10_000;

/**
 * The Public API's side of a node's WebRTC transport. The transport is read when called (it runs
 * only once the node listens); a tone for a device connected to another node goes there as a
 * command over the bus, which this node answers in turn for its own connections.
 */
export function nodeWebRtcPort(node: {
  domain: Domain;
  commands: Commands;
  transport: WebRtcTransport | undefined;
  config: { node_name: string };
}): WebRtcPort {
  node.commands.handle("audio.tone", ({ key, frequency, duration }) =>
    typeof key === "string" && typeof frequency === "number" && typeof duration === "number" ? node.transport?.playTone(key, frequency, duration) : undefined,
  );
  return {
    answer: (offer, timing, from) => {
      if (!node.transport)
        throw new DomainError("unavailable", "UNAVAILABLE", "this node does not answer offers (its WebRTC transport is not running)", undefined, 1);
      return node.transport.answer(offer, timing, from);
    },
    playTone: async (key, frequency, duration) => {
      const here = node.transport?.playTone(key, frequency, duration);
      if (here) return here;
      const { online, node: holder } = await node.domain.peers.runtime(key);
      if (!online || holder === undefined || holder === node.config.node_name) return undefined;
      try {
        return (await node.commands.call(holder, "audio.tone", { key, frequency, duration }, TONE_COMMAND_TIMEOUT_MS)) as { frames: number } | undefined;
      } catch (err) {
        if (err instanceof CommandError) return undefined;
        throw err;
      }
    },
  };
}
