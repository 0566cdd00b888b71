import { readFileSync } from "node:fs";
import { networkInterfaces } from "node:os";
import type { Command } from "commander";
import { renderUnicodeCompact } from "uqr";
import { loadConfig } from "../config/config.ts";
import { decodePrivateKey, type KeyPair, keyPairFromPrivate } from "../crypto/keys.ts";
import { readTlsFiles } from "../http/tls.ts";
import type { PeerStatus } from "../protocol/public.ts";
import { PerchApiError, PerchClient } from "../sdk/client.ts";
import { registerConnectCommand } from "./device-connect.ts";
import { trustOnlyCertificate } from "./local-tls.ts";
import { unreachable } from "./unreachable.ts";

interface DeviceOptions {
  server?: string;
  keyFile: string;
}

/**
 * The server on this machine as its configuration says (`./perch.yaml` or `PERCH_CONFIG`, `PERCH_PORT`):
 * its port, on the loopback address when it listens on all; over HTTPS, trusting exactly its
 * configured certificate, when it has `tls`.
 */
function localServer(fail: (message: string) => never): string {
  let url: string;
  let cert: Buffer | undefined;
  try {
    const { host, port, tls } = loadConfig();
    const address = host === "0.0.0.0" || host === "::" || host === "" ? "127.0.0.1" : host.includes(":") ? `[${host}]` : host;
    url = `${tls ? "https" : "http"}://${address}:${port}`;
    cert = tls ? readTlsFiles(tls).cert : undefined;
  } catch (err) {
    fail(`no --server given, and the configuration cannot be read: ${(err as Error).message}`);
  }
  if (cert) trustOnlyCertificate(cert);
  return url;
}

const LOOPBACK = /^(127\.|localhost$|\[::1\]$|::1$)/;

/** This machine's first non-internal IPv4 address: where a phone on the same network reaches it. */
function lanAddress(): string | undefined {
  for (const list of Object.values(networkInterfaces())) {
    for (const a of list ?? []) if (a.family === "IPv4" && !a.internal) return a.address;
  }
  return undefined;
}

/**
 * The companion app's address as a phone reaches it: the server's public endpoint (`endpoint` of
 * `/server-info`, from `public_endpoint`) when it has one, with the scheme of `--server`; else, for a
 * server on this machine that listens on all addresses, this machine's LAN address; else `--server`.
 */
export function appAddress(
  server: string,
  info: { endpoint: string },
  o: { lan?: string | undefined; listensOnAll?: boolean } = {},
): { url: string; from: "public_endpoint" | "lan_address" | "server"; says: string } {
  const base = new URL(server);
  // Without a public endpoint the server answers with the address it was asked at.
  if (info.endpoint && info.endpoint !== base.host) {
    return { url: `${base.protocol}//${info.endpoint}/app/`, from: "public_endpoint", says: `the server's public endpoint ${info.endpoint} (public_endpoint)` };
  }
  if (LOOPBACK.test(base.hostname)) {
    const lan = "lan" in o ? o.lan : lanAddress();
    const listensOnAll = o.listensOnAll ?? listensOnAllAddresses();
    if (lan && listensOnAll) {
      const port = base.port ? `:${base.port}` : "";
      return {
        url: `${base.protocol}//${lan}${port}/app/`,
        from: "lan_address",
        says: `this machine's LAN address ${lan}: the server has no public_endpoint; a phone on the same network opens it`,
      };
    }
    return {
      url: new URL("/app/", server).toString(),
      from: "server",
      says: `${base.hostname} is this machine only: a phone cannot open it; set public_endpoint (or --app-url)${listensOnAll ? "" : " and let the server listen on all addresses (host)"}`,
    };
  }
  return { url: new URL("/app/", server).toString(), from: "server", says: `the --server address ${base.host}` };
}

/** Whether this machine's configuration has its server listen on all addresses (the default). */
function listensOnAllAddresses(): boolean {
  try {
    const { host } = loadConfig();
    return host === "0.0.0.0" || host === "::" || host === "";
  } catch {
    return true;
  }
}

/**
 * `perch device …`: act as a device against a running server through the SDK (login with the
 * key pair that `perch keygen` wrote, then one Public API call). For trying a server by hand.
 */
export function registerDeviceCommands(program: Command, print: (value: unknown) => void, fail: (message: string) => never): void {
  const device = program
    .command("device")
    .description("act as a device through the SDK: log in with a key file from `perch keygen`, then call the Public API")
    .option(
      "--server <url>",
      "the server's base URL (default: this machine's server, at the port and scheme its configuration names: PERCH_CONFIG or ./perch.yaml, PERCH_PORT, else 8080)",
    )
    .requiredOption("--key-file <file>", "JSON key pair written by `perch keygen`");

  const serverUrl = () => device.opts<DeviceOptions>().server ?? localServer(fail);
  const load = () => {
    const { keyFile } = device.opts<DeviceOptions>();
    let keyPair: KeyPair;
    try {
      keyPair = keyPairFromPrivate(decodePrivateKey((JSON.parse(readFileSync(keyFile, "utf8")) as { private_key: string }).private_key));
    } catch (err) {
      fail(`cannot read a key pair from ${keyFile}: ${(err as Error).message}`);
    }
    return { server: serverUrl(), keyPair };
  };
  registerConnectCommand(device, load, fail);

  const run = (call: (client: PerchClient) => Promise<unknown>) => async () => {
    const { server, keyPair } = load();
    const client = new PerchClient({ baseUrl: server, keyPair });
    try {
      await client.login({ registrationToken: process.env.PERCH_REGISTRATION_TOKEN || undefined });
      const result = await call(client);
      if (result !== undefined) print(result);
    } catch (err) {
      fail(err instanceof PerchApiError ? err.message : unreachable(server, err));
    }
  };

  device
    .command("me")
    .description("the device's registration")
    .action(run((c) => c.me()));
  device
    .command("status")
    .description("read the status document, or replace it with --set")
    .option("--set <json>", "a PeerStatus JSON document")
    .action(async (opts: { set?: string }) => {
      let status: PeerStatus | undefined;
      if (opts.set !== undefined) {
        try {
          status = JSON.parse(opts.set) as PeerStatus;
        } catch {
          fail("--set must be a JSON document");
        }
      }
      await run((c) => (status ? c.putStatus(status) : c.status()))();
    });
  device
    .command("runtime")
    .description("whether and where the device is connected")
    .action(run((c) => c.runtime()));
  device
    .command("token")
    .description("issue a single-use Side Control device token (5 minutes) to hand to a phone: its companion app link, and that link as a QR code (on stderr)")
    .option("--app-url <url>", "the companion app's address as the phone reaches it (default: the server's /app/)")
    .option("--no-qr", "print no QR code")
    .action(async (opts: { appUrl?: string; qr: boolean }) => {
      await run(async (c) => {
        const token = await c.createDeviceToken();
        const app = opts.appUrl ? { url: opts.appUrl, from: "app_url" as const, says: "the --app-url given" } : appAddress(serverUrl(), await c.serverInfo());
        const link = `${app.url}#token=${token.token}`;
        if (opts.qr)
          process.stderr.write(`${renderUnicodeCompact(link, { border: 1 })}\nOpen on the phone (valid 5 minutes, once): ${link}\n  (${app.says})\n`);
        return { ...token, link, link_from: app.from };
      })();
    });
  device
    .command("sessions")
    .description("the live Side Control sessions aimed at this device")
    .action(run((c) => c.sideControlSessions()));
}
