/**
 * `npm run bench -- webrtc-connect`: connect-to-ready alone, one connect at a time, with the device
 * SDK (`@roamhq/wrtc`, libwebrtc) and with node-datachannel devices (a crowd worker), in
 * `BENCH_ROUNDS` (3) rounds of `BENCH_WEBRTC_CONNECTS` (20) connects each. With `BENCH_COMPARE_ROOT`
 * (another checkout, its dependencies installed) that checkout's server runs beside this one's and
 * each round measures both, one after the other, so that the figures are side by side.
 */
import { mkdtempSync, rmSync } from "node:fs";
import { loadavg, tmpdir } from "node:os";
import { join } from "node:path";
import { generateKeyPair } from "../src/crypto/keys.ts";
import { PerchConnection } from "../src/sdk/webrtc.ts";
import { Crowd } from "./crowd.ts";
import { benchConfig, percentiles, ROOT, round, type Server, startServer } from "./support.ts";

const env = (name: string, fallback: number) => Number(process.env[name] ?? fallback);
const CONNECTS = env("BENCH_WEBRTC_CONNECTS", 20);
const ROUNDS = env("BENCH_ROUNDS", 3);

interface Target {
  name: string;
  server: Server;
  crowd: Crowd;
  dir: string;
  sdk: number[];
  /** SDK: from the start to the answer's arrival (its key, the offer and its gathering, the request). */
  sdkToAnswer: number[];
  /** SDK: from the answer's arrival to ready (ICE, DTLS, SCTP and the two channels). */
  sdkAfterAnswer: number[];
  offer: number[];
  light: number[];
  /** node-datachannel connects that failed, and attempts retried (each a 15 s timeout or a refusal), with their first errors. */
  lightFailed: number;
  lightRetried: number;
  lightErrors: string[];
}

async function start(name: string, root: string): Promise<Target> {
  const dir = mkdtempSync(join(tmpdir(), "perch-bench-connect-"));
  const server = await startServer(
    {
      PERCH_DATA_DIR: dir,
      PERCH_LOG_LEVEL: "warn",
      ...benchConfig(dir, { rate_limits: { login_per_key: 0, login_per_address: 0, device_token_per_device: 0, offer_per_key: 0 } }),
    },
    root,
  );
  const serverKey = ((await (await fetch(`${server.url}/server-info`)).json()) as { public_key: string }).public_key;
  const crowd = new Crowd(1, { url: server.url, serverKey, bindAddress: new URL(server.url).hostname });
  return { name, server, crowd, dir, sdk: [], sdkToAnswer: [], sdkAfterAnswer: [], offer: [], light: [], lightFailed: 0, lightRetried: 0, lightErrors: [] };
}

async function measureRound(t: Target): Promise<void> {
  for (let i = 0; i < CONNECTS; i++) {
    const c = await PerchConnection.connect({ baseUrl: t.server.url, keyPair: generateKeyPair() });
    t.offer.push(Number(/total;dur=([\d.]+)/.exec(c.timings.serverTiming)?.[1] ?? Number.NaN));
    t.sdk.push(c.timings.ready);
    t.sdkToAnswer.push(c.timings.offer);
    t.sdkAfterAnswer.push(c.timings.ready - c.timings.offer);
    c.close();
  }
  const light = await t.crowd.connectSequentially(CONNECTS);
  t.light.push(...light.ready);
  t.lightFailed += light.failed;
  t.lightRetried += light.retried;
  t.lightErrors.push(...light.errors.slice(0, 5 - t.lightErrors.length));
  await t.crowd.release();
}

function figures(t: Target) {
  const within = (xs: number[], ms: number) => xs.filter((x) => x <= ms).length;
  return {
    connect_to_ready_ms_sdk: { ...percentiles(t.sdk), n: t.sdk.length, within_100_ms: within(t.sdk, 100) },
    sdk_start_to_answer_ms: percentiles(t.sdkToAnswer),
    sdk_answer_to_ready_ms: percentiles(t.sdkAfterAnswer),
    connect_to_ready_ms_node_datachannel: {
      ...percentiles(t.light),
      n: t.light.length,
      within_100_ms: within(t.light, 100),
      over_500_ms: t.light.length - within(t.light, 500),
      failed: t.lightFailed,
      retried: t.lightRetried,
      ...(t.lightErrors.length > 0 ? { errors: t.lightErrors } : {}),
    },
    offer_handling_ms_server: percentiles(t.offer),
  };
}

export async function webrtcConnectBench(): Promise<unknown> {
  const loadBefore = loadavg().map(round);
  const compareRoot = process.env.BENCH_COMPARE_ROOT;
  const targets = [await start("perch", ROOT)];
  if (compareRoot) targets.push(await start("compared", compareRoot));
  try {
    for (let r = 0; r < ROUNDS; r++) for (const t of targets) await measureRound(t);
    return {
      suite: "webrtc-connect",
      node: process.version,
      connects_per_round: CONNECTS,
      rounds: ROUNDS,
      goal_connect_to_ready_ms_p50: 100,
      load_average: { before: loadBefore, after: loadavg().map(round) },
      ...Object.fromEntries(targets.map((t) => [t.name, figures(t)])),
    };
  } finally {
    for (const t of targets) {
      await t.crowd.stop().catch(() => t.crowd.kill());
      await t.server.stop();
      rmSync(t.dir, { recursive: true, force: true });
    }
  }
}
