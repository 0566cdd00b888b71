/**
 * One run of the telemetry-ingest bench (bench/telemetry-ingest.ts), in its own process: the
 * modules under test come from the checkout named by argv[2], so that two checkouts can be measured
 * side by side. What a node's JavaScript thread does for each telemetry packet, without WebRTC: the
 * packet checked, limited, decoded, queued in the writer and stored (a SQLite store in a temporary
 * directory, or the fresh PostgreSQL database named by argv[6]; `DEVICES` registered peers). `SECONDS` of traffic at `RATE` frames a second a device,
 * on a manual clock advanced 10 ms per tick's worth of frames, fed as fast as the writer keeps up
 * (a backlog over 20,000 samples waits): CPU time per stored frame, not wall time, is the figure,
 * so a machine busy with other work slows the run without changing it much. Prints one JSON line.
 */
import { mkdtempSync, rmSync } from "node:fs";
import { tmpdir } from "node:os";
import { join } from "node:path";
import { telemetryPacket } from "./telemetry-packet.ts";

const [root, devicesArg, rateArg, secondsArg, databaseUrl] = process.argv.slice(2);
const DEVICES = Number(devicesArg);
const RATE = Number(rateArg);
const SECONDS = Number(secondsArg);
const TICK_MS = 10;

const from = (path: string) => import(join(root!, "src", path));
const { Store } = await from("store/index.ts");
const { InProcessBus } = await from("events/index.ts");
const { DomainEvents } = await from("domain/changes.ts");
const { Domain } = await from("domain/index.ts");
const { newPeer } = await from("domain/auth.ts");
const { loadConfig } = await from("config/config.ts");
const { ManualClock } = await from("domain/clock.ts");
const { TelemetryWriter } = await from("domain/telemetry-writer.ts");
const { TelemetryIngest } = await from("transport/telemetry-ingest.ts");
const { generateKeyPair, encodeKey, privateKeyObject } = await from("crypto/keys.ts");

const dataDir = mkdtempSync(join(tmpdir(), "perch-ingest-"));
try {
  const config = loadConfig({}, { data_dir: dataDir });
  const clock = new ManualClock(Date.now());
  // A PostgreSQL database when one is named (a fresh one, made by the caller), else SQLite in the temporary directory.
  const store = await Store.open(databaseUrl || undefined, dataDir);
  const keys = Array.from({ length: DEVICES }, () => encodeKey(generateKeyPair().publicKey) as string);
  await store.transaction(async (tx: any) => {
    for (const key of keys) await tx.peers.register(newPeer(key, Date.now()));
  });
  const pair = generateKeyPair();
  const serverKey = { ...pair, privateKeyObject: privateKeyObject(pair.privateKey), publicKeyText: encodeKey(pair.publicKey) };
  const domain = new Domain({ store, clock, config, serverKey, events: new DomainEvents(new InProcessBus()) });
  const counts = { stored: 0, dropped: {} as Record<string, number>, errors: 0 };
  const drop = (reason: string, frames = 1) => {
    counts.dropped[reason] = (counts.dropped[reason] ?? 0) + frames;
  };
  const writer = new TelemetryWriter({
    sink: domain.telemetry,
    onStored: (frames: number) => {
      counts.stored += frames;
    },
    onDropped: drop,
    onError: () => {
      counts.errors++;
    },
  });
  const ingest = new TelemetryIngest({ writer, metrics: { dropped: drop }, clock, maxPeers: DEVICES });
  const tick = (DEVICES * RATE * TICK_MS) / 1000;

  // Every packet made before the clock starts: the bench's own encoding is not measured.
  const perDevice = Math.ceil(RATE * SECONDS);
  const start = Date.now();
  const packets = keys.map((_, d) => Array.from({ length: perDevice }, (_, i) => telemetryPacket(i, start + i * Math.floor(1000 / RATE) + (d % 7))));
  const total = DEVICES * perDevice;

  const cpu0 = process.cpuUsage();
  const t0 = performance.now();
  let sent = 0;
  while (sent < total) {
    if (writer.heldSamples > 20_000) {
      await new Promise((r) => setTimeout(r, 1));
      continue;
    }
    const end = Math.min(total, sent + tick);
    for (; sent < end; sent++) ingest.packet(keys[sent % DEVICES]!, packets[sent % DEVICES]![Math.floor(sent / DEVICES)]!);
    clock.advance(TICK_MS);
    await new Promise((r) => setImmediate(r));
  }
  await writer.close();
  const wall = (performance.now() - t0) / 1000;
  const cpu = process.cpuUsage(cpu0);
  const cpuSeconds = (cpu.user + cpu.system) / 1e6;
  await store.close();
  process.stdout.write(
    `${JSON.stringify({
      devices: DEVICES,
      frames_sent: sent,
      frames_stored: counts.stored,
      dropped_by_reason: counts.dropped,
      write_errors: counts.errors,
      seconds: Math.round(wall * 100) / 100,
      frames_stored_per_second: Math.round(counts.stored / wall),
      cpu_percent_of_one_core: Math.round((cpuSeconds / wall) * 1000) / 10,
      cpu_us_per_frame: Math.round((cpuSeconds * 1e6 * 100) / Math.max(1, counts.stored)) / 100,
    })}\n`,
  );
} finally {
  rmSync(dataDir, { recursive: true, force: true });
}
