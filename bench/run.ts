/** `npm run bench -- <suite>…`: runs benchmark suites and prints one JSON document per suite. */
import { backchannelBench } from "./backchannel.ts";
import { capacityBench } from "./capacity.ts";
import { compatBench } from "./compat.ts";
import { eventsBench } from "./events.ts";
import { fleetBench } from "./fleet.ts";
import { hearingBench } from "./hearing.ts";
import { mcpBoundsBench } from "./mcp-bounds.ts";
import { outageBench } from "./outage.ts";
import { publicBench } from "./public.ts";
import { realtimeAttackBench } from "./realtime-attack.ts";
import { revocationBench } from "./revocation.ts";
import { speechBench } from "./speech.ts";
import { telemetryIngestBench } from "./telemetry-ingest.ts";
import { toolsBench } from "./tools.ts";
import { uplinkBench } from "./uplink.ts";
import { usageBench } from "./usage.ts";
import { voiceBench } from "./voice.ts";
import { webrtcBench } from "./webrtc.ts";
import { webrtcConnectBench } from "./webrtc-connect.ts";
import { webrtcHealthBench } from "./webrtc-health.ts";

const suites: Record<string, () => Promise<unknown>> = {
  public: publicBench,
  compat: compatBench,
  speech: speechBench,
  hearing: hearingBench,
  backchannel: backchannelBench,
  webrtc: webrtcBench,
  "webrtc-health": webrtcHealthBench,
  "webrtc-connect": webrtcConnectBench,
  outage: outageBench,
  events: eventsBench,
  "telemetry-ingest": telemetryIngestBench,
  voice: voiceBench,
  tools: toolsBench,
  uplink: uplinkBench,
  "mcp-bounds": mcpBoundsBench,
  revocation: revocationBench,
  capacity: capacityBench,
  fleet: fleetBench,
  usage: usageBench,
  "realtime-attack": realtimeAttackBench,
};
/** Options that take a value (`--engines provider`): read by their suites, not suite names. */
const VALUED = new Set(["--engines", "--base", "--steps", "--step-seconds"]);
const args = process.argv.slice(2);
const wanted = args.filter((a, i) => a !== "--" && !a.startsWith("--") && !VALUED.has(args[i - 1] ?? ""));
const names = wanted.length > 0 ? wanted : Object.keys(suites);
for (const name of names) {
  const suite = suites[name];
  if (!suite) {
    process.stderr.write(`unknown bench suite ${name}; known: ${Object.keys(suites).join(", ")}\n`);
    process.exit(2);
  }
  const report = `${JSON.stringify(await suite(), null, 2)}\n`;
  await new Promise((resolve) => process.stdout.write(report, resolve));
}
// Leave at once: @roamhq/wrtc's native module can crash while Node tears its objects down.
process.exit(0);
