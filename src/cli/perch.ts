#!/usr/bin/env node
/**
 * The `perch` command line. Each command loads what it needs when it runs (the store and domain,
 * the server, the device SDK): a command's start costs what it uses, not the whole program's
 * ~800 modules (tests run it hundreds of times).
 */
import { createHash, randomBytes } from "node:crypto";
import { join } from "node:path";
import { Command } from "commander";
import { type Config, ConfigError, configFile, loadConfig } from "../config/config.ts";
import { canonicalKey, encodeKey, generateKeyPair } from "../crypto/keys.ts";
import type { Domain } from "../domain/index.ts";
import { registerDeviceCommands } from "./device.ts";
import { registerUsageCommands } from "./usage.ts";

/** Runs `fn` with a domain over the configured store (no listener), then closes the store. */
async function withDomain<T>(fn: (domain: Domain) => Promise<T>): Promise<T> {
  const config = loadConfig();
  const [{ loadOrCreateServerKey }, { privateKeyObject }, { systemClock }, { DomainEvents }, { Domain }, { openEventBus }, { Store }] = await Promise.all([
    import("../config/server-key.ts"),
    import("../crypto/keys.ts"),
    import("../domain/clock.ts"),
    import("../domain/changes.ts"),
    import("../domain/index.ts"),
    import("../bus/index.ts"),
    import("../store/index.ts"),
  ]);
  const pair = loadOrCreateServerKey(config.server_key_file ?? join(config.data_dir, "server.key"));
  const store = await Store.open(config.database_url, config.data_dir, { readWorkers: 0 });
  try {
    // On PostgreSQL what this process changes (a peer blocked or removed) reaches every node; it listens to nothing.
    const bus = await openEventBus(config.database_url, { listen: false });
    try {
      const serverKey = { ...pair, privateKeyObject: privateKeyObject(pair.privateKey), publicKeyText: encodeKey(pair.publicKey) };
      return await fn(new Domain({ store, clock: systemClock, config, serverKey, events: new DomainEvents(bus) }));
    } finally {
      await bus.close();
    }
  } finally {
    await store.close();
  }
}

function keyArg(text: string): string {
  const key = canonicalKey(text);
  if (!key) fail(`not a base58 X25519 public key: ${text}`);
  return key;
}

function fail(message: string): never {
  process.stderr.write(`perch: ${message}\n`);
  process.exit(1);
}

function print(value: unknown): void {
  process.stdout.write(`${JSON.stringify(value, null, 2)}\n`);
}

/** A listener that could not start, in one line naming the port and the setting that chose it; undefined for any other failure. */
function listenFailure(err: unknown, config: Config): string | undefined {
  const e = err as NodeJS.ErrnoException & { port?: number; address?: string };
  if (e?.code !== "EADDRINUSE" && e?.code !== "EACCES") return undefined;
  const udp = e.syscall === "bind" || (config.webrtc.udp_port !== undefined && e.port === config.webrtc.udp_port && e.port !== config.port);
  const setting = udp ? "webrtc.udp_port (PERCH_WEBRTC_UDP_PORT; default the HTTP port's number)" : "port (PERCH_PORT)";
  const port = e.port ?? (udp ? config.webrtc.udp_port : config.port);
  const where = e.address ? ` on ${e.address}` : "";
  return e.code === "EADDRINUSE"
    ? `port ${port}${where} is already in use (by another server?): stop it, or choose another with ${setting}`
    : `port ${port}${where} needs privileges this process lacks: choose a port above 1023 with ${setting}`;
}

async function serve(): Promise<void> {
  // The configuration first: a mistake in it is said before the server's modules are loaded.
  const config = loadConfig();
  const { startServer } = await import("../server.ts");
  let server: Awaited<ReturnType<typeof startServer>>;
  // Node exits 0 when nothing is left to wait for: a step of the start that neither finishes nor
  // fails (twice seen in the suite at load 20+, a port in use then ending the process silently with
  // 0) says so instead, and fails.
  const halfway = () => fail("the server's start ended halfway: a step of it neither finished nor failed (a defect: please report it)");
  process.once("beforeExit", halfway);
  try {
    server = await startServer({ config, warmUp: true });
  } catch (err) {
    fail(listenFailure(err, config) ?? (err instanceof ConfigError ? err.message : String((err as Error)?.stack ?? err)));
  }
  process.off("beforeExit", halfway);
  // However the node ends (a drain asked through the store included), the process exits 0 once its store is closed.
  server.finished.then(
    () => process.exit(0),
    (err) => fail(String(err)),
  );
  // The first SIGTERM or SIGINT drains (fleet.md §3); a second stops at once (the store still closed cleanly).
  let signals = 0;
  const stop = (signal: string) => {
    signals++;
    if (signals === 1) {
      process.stderr.write(`perch: ${signal}, draining: devices are handed to other nodes as their replies end (again to stop at once)\n`);
      server.drain().catch((err) => fail(String(err)));
    } else if (signals === 2) {
      process.stderr.write(`perch: ${signal} again, stopping now\n`);
      server.close().catch((err) => fail(String(err)));
    }
  };
  process.on("SIGINT", () => stop("SIGINT"));
  process.on("SIGTERM", () => stop("SIGTERM"));
}

/** `perch nodes`: one line per node, its state, the age of its heartbeat and its load. */
function nodeTable(rows: Awaited<ReturnType<Domain["nodes"]["list"]>>): string {
  const head = ["NAME", "STATE", "ENDPOINT", "HEARTBEAT", "CONNECTIONS", "CONVERSATIONS", "CPU", "STARTED"];
  const lines = rows.map((n) => [
    n.name,
    n.drain_requested && n.state !== "draining" ? `${n.state} (drain asked)` : n.state,
    n.endpoint ?? "-",
    `${(n.heartbeat_age_ms / 1000).toFixed(1)} s ago`,
    String(n.connections),
    String(n.conversations),
    n.cpu.toFixed(2),
    n.started_at,
  ]);
  const widths = head.map((h, i) => Math.max(h.length, ...lines.map((l) => l[i]!.length)));
  return [head, ...lines]
    .map((l) =>
      l
        .map((c, i) => c.padEnd(widths[i]!))
        .join("  ")
        .trimEnd(),
    )
    .join("\n");
}

// With PERCH_CONFIG unset, ./perch.yaml (or .yml, .json) here is the configuration of the server
// and of every command (the port `device … connect` dials, the scheme of the phone link).
try {
  const file = configFile();
  if (file !== undefined && process.env.PERCH_CONFIG === undefined) process.env.PERCH_CONFIG = file;
} catch (err) {
  fail((err as Error).message);
}

const program = new Command("perch").description(
  "Perch: a server for connected AI devices. Settings come from PERCH_* variables and the file PERCH_CONFIG names (when unset, ./perch.yaml, .yml or .json).",
);

program.command("serve", { isDefault: true }).description("run the server").action(serve);

program
  .command("keygen")
  .description("print a new X25519 device key pair (base58)")
  .action(() => {
    const pair = generateKeyPair();
    print({ public_key: encodeKey(pair.publicKey), private_key: encodeKey(pair.privateKey) });
  });

program
  .command("api-key")
  .description("print a new Compatible API key and the SHA-256 to list under api_keys (only the hash goes in the configuration)")
  .action(() => {
    const key = `sk-perch-${randomBytes(24).toString("base64url")}`;
    print({ key, sha256: createHash("sha256").update(key).digest("hex") });
  });

registerDeviceCommands(program, print, fail);

const peers = program.command("peers").description("registered peers");
peers
  .command("list")
  .description("list registered peers: whether each is connected now, and the name and emoji it gave itself")
  .action(() =>
    withDomain(async (d) => {
      const rows = await d.peers.list();
      const online = await Promise.all(rows.map(async (p) => (await d.peers.runtime(p.public_key)).online));
      print(
        rows.map((p, i) => {
          const info = deviceInfo(p.device_info);
          return {
            public_key: p.public_key,
            ...(info.name !== undefined ? { name: info.name } : {}),
            ...(info.emoji !== undefined ? { emoji: info.emoji } : {}),
            online: online[i],
            role: p.role,
            status: p.status,
            created_at: new Date(p.created_at).toISOString(),
          };
        }),
      );
    }),
  );

/** The name and emoji a device gave itself (`server.info.put`), from the stored JSON. */
function deviceInfo(text: string): { name?: string; emoji?: string } {
  try {
    const v = JSON.parse(text) as { name?: unknown; emoji?: unknown };
    return { ...(typeof v.name === "string" ? { name: v.name } : {}), ...(typeof v.emoji === "string" ? { emoji: v.emoji } : {}) };
  } catch {
    return {};
  }
}
peers
  .command("add <key>")
  .description("register a key (needed under registration policy closed)")
  .option("--role <role>", "client or admin", "client")
  .action((key: string, opts: { role: string }) =>
    withDomain(async (d) => {
      if (opts.role !== "client" && opts.role !== "admin") fail("--role must be client or admin");
      print({ public_key: keyArg(key), added: await d.peers.add(keyArg(key), opts.role) });
    }),
  );
for (const [name, blocked] of [
  ["block", true],
  ["unblock", false],
] as const) {
  peers
    .command(`${name} <key>`)
    .description(blocked ? "refuse the peer's logins, offers and sessions" : "let a blocked peer back in")
    .action((key: string) =>
      withDomain(async (d) => {
        if (!(await d.peers.setBlocked(keyArg(key), blocked))) fail(`no registered peer ${key}`);
        print({ public_key: keyArg(key), status: blocked ? "blocked" : "active" });
      }),
    );
}
peers
  .command("tools <key>")
  .description("the tools a connected device offers now over its service stream 3, asked of the node that holds its connection")
  .action(async (key: string) => {
    const config = loadConfig();
    const peer = keyArg(key);
    const { Commands, openEventBus } = await import("../bus/index.ts");
    await withDomain(async (d) => {
      const { online, node } = await d.peers.runtime(peer);
      if (!online || node === undefined) return print({ public_key: peer, online: false, tools: [] });
      // On SQLite the command and its reply go through the file's bus_messages, read every 100 ms here.
      const store = d.ctx.store;
      const bus = await openEventBus(config.database_url, {
        sqlite: {
          file: store.sqliteFile,
          pollMs: 100,
          persist: (origin, topic, m) => store.transaction((tx) => tx.busMessages.add(origin, topic, m, Date.now())),
        },
      });
      const commands = new Commands(bus, undefined);
      try {
        const found = (await commands.call(node, "device.tools", { key: peer })) as { tools: unknown[]; more: number } | undefined;
        // Named as the agents' configuration and the model see them: device.<name>.
        const tools = (found?.tools ?? []).map((t) => (t && typeof t === "object" && "name" in t ? { ...t, name: `device.${String(t.name)}` } : t));
        print({ public_key: peer, online: true, node, tools, ...(found?.more ? { more: found.more } : {}) });
      } catch (err) {
        const sqliteHint = store.sqliteFile ? " (on SQLite a node reads commands from the file only while webrtc.peer_poll_ms > 0)" : "";
        fail(`node ${node} did not answer: ${(err as Error).message}${sqliteHint}`);
      } finally {
        commands.close();
        await bus.close();
      }
    });
  });
peers
  .command("voice <key> <agent>")
  .description(
    "choose the agent that converses with the device over its audio: an agent id, off, or default (voice.agent); live conversations take it at once, on every node",
  )
  .action((key: string, agent: string) =>
    withDomain(async (d) => {
      const agents = loadConfig().agents.map((a) => a.id);
      if (agent !== "off" && agent !== "default" && !agents.includes(agent)) {
        fail(`no agent ${agent} in the configuration (agents: ${agents.join(", ") || "none"}); use an agent id, off or default`);
      }
      if (!(await d.peers.setVoiceAgent(keyArg(key), agent === "default" ? null : agent))) fail(`no registered peer ${key}`);
      print({ public_key: keyArg(key), voice_agent: agent });
    }),
  );
peers
  .command("transcripts <key>")
  .description("print the device's stored voice conversations with their entries, newest first; --delete deletes them all for good")
  .option("--delete", "delete every stored conversation of the device")
  .action((key: string, opts: { delete?: boolean }) =>
    withDomain(async (d) => {
      const publicKey = keyArg(key);
      if ((await d.peers.voiceAgent(publicKey)) === undefined) fail(`no registered peer ${key}`);
      if (opts.delete) print({ public_key: publicKey, deleted: await d.conversations.deleteAll(publicKey) });
      else print({ public_key: publicKey, stored: d.conversations.storing, conversations: await d.conversations.transcripts(publicKey) });
    }),
  );
peers
  .command("memory <key>")
  .description("print what the device's agent remembers of its people; --delete forgets it for good")
  .option("--delete", "forget the device's memory for good (deleted from the store and, on SQLite, from its files)")
  .action((key: string, opts: { delete?: boolean }) =>
    withDomain(async (d) => {
      const publicKey = keyArg(key);
      const memory = await d.memory.text(publicKey);
      if (!memory) fail(`no registered peer ${key}`);
      if (opts.delete) {
        await d.memory.forget(publicKey);
        print({ public_key: publicKey, forgotten: memory.text !== "" });
      } else print({ public_key: publicKey, ...(await d.memory.view(publicKey)) });
    }),
  );
peers
  .command("remove <key>")
  .description("remove the peer with its sessions, tokens, status, telemetry, contacts, stored conversations and memory")
  .action((key: string) =>
    withDomain(async (d) => {
      if (!(await d.peers.remove(keyArg(key)))) fail(`no registered peer ${key}`);
      print({ public_key: keyArg(key), removed: true });
    }),
  );

registerUsageCommands(program, peers, { keyArg, fail, print, withDomain });

const nodes = program
  .command("nodes")
  .description("the nodes sharing the store: state (serving, full, draining, gone), heartbeat age and load")
  .option("--json", "print JSON")
  .action((opts: { json?: boolean }) =>
    withDomain(async (d) => {
      const rows = await d.nodes.list();
      if (opts.json) print(rows);
      else process.stdout.write(rows.length ? `${nodeTable(rows)}\n` : "no nodes\n");
    }),
  );
nodes
  .command("drain <name>")
  .description("ask a node to drain (as SIGTERM does): it reads this from the store within seconds, hands its devices over and exits")
  .action((name: string) =>
    withDomain(async (d) => {
      if (!(await d.nodes.requestDrain(name))) fail(`no node ${name} is serving (see perch nodes)`);
      print({ name, drain_requested: true });
    }),
  );

const sessions = program.command("sessions").description("login sessions");
sessions
  .command("list")
  .description("list live sessions")
  .action(() =>
    withDomain(async (d) => {
      const rows = await d.auth.liveSessions();
      print(
        rows.map((s) => ({
          id: s.id,
          kind: s.kind,
          public_key: s.public_key,
          ...(s.kind === "side_control" ? { target_key: s.target_key } : {}),
          created_at: new Date(s.created_at).toISOString(),
          expires_at: new Date(s.expires_at).toISOString(),
        })),
      );
    }),
  );
sessions
  .command("revoke <id>")
  .description("revoke a session at once, on every node")
  .action((id: string) =>
    withDomain(async (d) => {
      if (!(await d.auth.revokeSession(id))) fail(`no live session ${id}`);
      print({ id, revoked: true });
    }),
  );

program.parseAsync().catch((err) => fail(err instanceof ConfigError ? err.message : String(err?.stack ?? err)));
