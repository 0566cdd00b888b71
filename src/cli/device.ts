import { readFileSync } from "node:fs";
import type { Command } from "commander";
import { renderUnicodeCompact } from "uqr";
import { loadConfig } from "../config/config.ts";
import { decodePrivateKey, type KeyPair, keyPairFromPrivate } from "../crypto/keys.ts";
import type { PeerStatus } from "../protocol/public.ts";
import { PerchApiError, PerchClient } from "../sdk/client.ts";
import { registerConnectCommand } from "./device-connect.ts";
import { unreachable } from "./unreachable.ts";

interface DeviceOptions {
  server?: string;
  keyFile: string;
}

/** The server on this machine as its configuration says (`PERCH_CONFIG`, `PERCH_PORT`): its port, on the loopback address when it listens on all. */
function localServer(fail: (message: string) => never): string {
  try {
    const { host, port } = loadConfig();
    const address = host === "0.0.0.0" || host === "::" || host === "" ? "127.0.0.1" : host.includes(":") ? `[${host}]` : host;
    return `http://${address}:${port}`;
  } catch (err) {
    fail(`no --server given, and the configuration cannot be read: ${(err as Error).message}`);
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
      "the server's base URL (default: this machine's server, at the port its configuration names: PERCH_CONFIG, PERCH_PORT, else 8080)",
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
        const link = `${opts.appUrl ?? new URL("/app/", serverUrl()).toString()}#token=${token.token}`;
        if (opts.qr) process.stderr.write(`${renderUnicodeCompact(link, { border: 1 })}\nOpen on the phone (valid 5 minutes, once): ${link}\n`);
        return { ...token, link };
      })();
    });
  device
    .command("sessions")
    .description("the live Side Control sessions aimed at this device")
    .action(run((c) => c.sideControlSessions()));
}
