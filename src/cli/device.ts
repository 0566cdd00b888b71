import { readFileSync } from "node:fs";
import type { Command } from "commander";
import { renderUnicodeCompact } from "uqr";
import { decodePrivateKey, keyPairFromPrivate } from "../crypto/keys.ts";
import type { PeerStatus } from "../protocol/public.ts";
import { PerchApiError, PerchClient } from "../sdk/client.ts";
import { registerConnectCommand } from "./device-connect.ts";

interface DeviceOptions {
  server: string;
  keyFile: string;
}

/**
 * `perch device …`: act as a device against a running server through the SDK (login with the
 * key pair that `perch keygen` wrote, then one Public API call). For trying a server by hand.
 */
export function registerDeviceCommands(program: Command, print: (value: unknown) => void, fail: (message: string) => never): void {
  const device = program
    .command("device")
    .description("act as a device through the SDK: log in with a key file from `perch keygen`, then call the Public API")
    .option("--server <url>", "the server's base URL", `http://127.0.0.1:${process.env.PERCH_PORT || 8080}`)
    .requiredOption("--key-file <file>", "JSON key pair written by `perch keygen`");

  const load = () => {
    const { server, keyFile } = device.opts<DeviceOptions>();
    try {
      const privateKey = decodePrivateKey((JSON.parse(readFileSync(keyFile, "utf8")) as { private_key: string }).private_key);
      return { server, keyPair: keyPairFromPrivate(privateKey) };
    } catch (err) {
      fail(`cannot read a key pair from ${keyFile}: ${(err as Error).message}`);
    }
  };
  registerConnectCommand(device, load, fail);

  const run = (call: (client: PerchClient) => Promise<unknown>) => async () => {
    const { server, keyFile } = device.opts<DeviceOptions>();
    let privateKey: Uint8Array;
    try {
      privateKey = decodePrivateKey((JSON.parse(readFileSync(keyFile, "utf8")) as { private_key: string }).private_key);
    } catch (err) {
      fail(`cannot read a key pair from ${keyFile}: ${(err as Error).message}`);
    }
    const client = new PerchClient({ baseUrl: server, keyPair: keyPairFromPrivate(privateKey) });
    try {
      await client.login({ registrationToken: process.env.PERCH_REGISTRATION_TOKEN || undefined });
      const result = await call(client);
      if (result !== undefined) print(result);
    } catch (err) {
      fail(err instanceof PerchApiError ? err.message : `cannot reach ${server}: ${(err as Error).message}`);
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
        const link = `${opts.appUrl ?? new URL("/app/", device.opts<DeviceOptions>().server).toString()}#token=${token.token}`;
        if (opts.qr) process.stderr.write(`${renderUnicodeCompact(link, { border: 1 })}\nOpen on the phone (valid 5 minutes, once): ${link}\n`);
        return { ...token, link };
      })();
    });
  device
    .command("sessions")
    .description("the live Side Control sessions aimed at this device")
    .action(run((c) => c.sideControlSessions()));
}
