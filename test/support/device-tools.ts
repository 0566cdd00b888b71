import type { DeviceTool, OfferedTools } from "../../src/sdk/tools.ts";
import type { PerchConnection } from "../../src/sdk/webrtc.ts";
import type { WebRtcTransport } from "../../src/transport/transport.ts";
import { eventually } from "./webrtc.ts";

/**
 * The device tool the tests offer, `set_volume` (a level 0–10): it records each call's arguments in
 * `got`, answers `answer(level)` (after `delayMs`, the turn waiting for it), and keeps the level.
 */
export function volumeTool(o: { answer?: (level: number) => string; delayMs?: number } = {}): { tool: DeviceTool; got: unknown[]; level: () => number } {
  const got: unknown[] = [];
  let level = 5;
  const tool: DeviceTool = {
    name: "set_volume",
    description: "Sets the speaker volume (0-10).",
    inputSchema: { type: "object", properties: { level: { type: "integer", minimum: 0, maximum: 10 } }, required: ["level"] },
    handler: async (args) => {
      got.push(args);
      level = args.level as number;
      if (o.delayMs) await new Promise((r) => setTimeout(r, o.delayMs));
      return o.answer ? o.answer(level) : `The volume is now ${level}.`;
    },
  };
  return { tool, got, level: () => level };
}

/** Offers `tools` on `conn` and resolves once `server` lists them for the device (the agent may then call them). */
export async function offerListed(
  server: { transport: WebRtcTransport | undefined },
  conn: PerchConnection,
  tools: readonly DeviceTool[],
): Promise<OfferedTools> {
  const offered = await conn.offerTools(tools);
  await eventually(() => server.transport!.deviceTools(conn.publicKey)?.tools.length === tools.length, 5000, "the device's tools listed");
  return offered;
}
