/**
 * The configuration file of the working directory and HTTPS (issue 46): `./perch.yaml` (or `.yml`,
 * `.json`) is read by the server and every command when PERCH_CONFIG is unset; `tls` serves HTTPS
 * on the same port, with a certificate made here by openssl, and refuses files that cannot serve.
 */
import assert from "node:assert/strict";
import { execFileSync } from "node:child_process";
import { rmSync, writeFileSync } from "node:fs";
import { join } from "node:path";
import { after, before, describe, test } from "node:test";
import { Agent } from "undici";
import { ConfigError, configFile } from "../src/config/config.ts";
import { encodeKey, generateKeyPair } from "../src/crypto/keys.ts";
import { assertFails, perch, perchJson } from "./support/cli.ts";
import { freeTcpPort, type ServerProcess, spawnServer, startTestServer, tempDir } from "./support/server.ts";

/** A self-signed certificate for the LAN name and the loopback address, and its key (PEM files in `dir`). */
function selfSigned(dir: string, name: string): { cert_file: string; key_file: string } {
  const cert_file = join(dir, `${name}.pem`);
  const key_file = join(dir, `${name}-key.pem`);
  execFileSync(
    "openssl",
    [
      ...["req", "-x509", "-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:P-256", "-nodes", "-days", "1"],
      ...["-subj", "/CN=perch-box.lan", "-addext", "subjectAltName=DNS:perch-box.lan,IP:127.0.0.1"],
      ...["-keyout", key_file, "-out", cert_file],
    ],
    { stdio: "ignore" },
  );
  return { cert_file, key_file };
}

describe("the configuration file of the working directory", () => {
  const dir = tempDir();
  after(() => rmSync(dir, { recursive: true, force: true }));

  test("./perch.yaml, .yml or .json when PERCH_CONFIG is unset; PERCH_CONFIG wins, empty meaning none; two files are an error naming both", () => {
    assert.equal(configFile({}, dir), undefined);
    for (const name of ["perch.json", "perch.yml", "perch.yaml"]) {
      writeFileSync(join(dir, name), "{}");
      assert.equal(configFile({}, dir), name);
      assert.equal(configFile({ PERCH_CONFIG: "other.yaml" }, dir), "other.yaml");
      assert.equal(configFile({ PERCH_CONFIG: "" }, dir), undefined);
      rmSync(join(dir, name));
    }
    writeFileSync(join(dir, "perch.yaml"), "{}");
    writeFileSync(join(dir, "perch.json"), "{}");
    assert.throws(
      () => configFile({}, dir),
      (err: Error) => err instanceof ConfigError && /\.\/perch\.yaml and \.\/perch\.json are both here/.test(err.message),
    );
    assert.equal(configFile({ PERCH_CONFIG: "perch.json" }, dir), "perch.json");
  });
});

describe("HTTPS on the configured port", () => {
  const dir = tempDir();
  const certificate = selfSigned(dir, "perch-box.lan");
  const other = selfSigned(dir, "other");
  after(() => rmSync(dir, { recursive: true, force: true }));

  test("serves HTTPS with the certificate (trusted: 200; untrusted: refused by the client; plain HTTP: no answer)", async () => {
    const server = await startTestServer({ config: { tls: certificate } });
    try {
      assert.match(server.url, /^https:\/\/127\.0\.0\.1:\d+$/);
      const { readFileSync } = await import("node:fs");
      const trusting = new Agent({ connect: { ca: readFileSync(certificate.cert_file) } });
      const res = await fetch(`${server.url}/server-info`, { dispatcher: trusting } as RequestInit);
      assert.equal(res.status, 200);
      assert.equal(((await res.json()) as { protocol: string }).protocol, "gizclaw-webrtc");
      const app = await fetch(`${server.url}/app/`, { dispatcher: trusting } as RequestInit);
      assert.equal(app.status, 200);
      await trusting.close();
      await assert.rejects(fetch(`${server.url}/server-info`), "a client that does not trust the certificate refuses it");
      await assert.rejects(fetch(`${server.url.replace("https:", "http:")}/server-info`), "no plain HTTP on the TLS port");
    } finally {
      await server.stop();
    }
  });

  test("start-up refuses a file it cannot read and a key that is not the certificate's, naming the paths", async () => {
    const missing = join(dir, "missing.pem");
    await assert.rejects(startTestServer({ config: { tls: { ...certificate, cert_file: missing } } }), new RegExp(`tls\\.cert_file ${missing} cannot be read`));
    await assert.rejects(startTestServer({ config: { tls: { ...certificate, key_file: missing } } }), new RegExp(`tls\\.key_file ${missing} cannot be read`));
    await assert.rejects(
      startTestServer({ config: { tls: { cert_file: certificate.cert_file, key_file: other.key_file } } }),
      new RegExp(`the key in tls\\.key_file ${other.key_file} does not match the certificate in tls\\.cert_file ${certificate.cert_file}`),
    );
    await assert.rejects(
      startTestServer({ config: { tls: { cert_file: certificate.key_file, key_file: certificate.key_file } } }),
      /not a usable PEM certificate/,
    );
    // `perch serve` says it in one line.
    const data = tempDir();
    const served = await perch(["serve"], {
      PERCH_TLS_CERT_FILE: missing,
      PERCH_TLS_KEY_FILE: certificate.key_file,
      PERCH_DATA_DIR: data,
      PERCH_PORT: "0",
      PERCH_HOST: "127.0.0.1",
    });
    rmSync(data, { recursive: true, force: true });
    assertFails(served, new RegExp(`^perch: tls\\.cert_file ${missing} cannot be read: ENOENT[^\\n]*\\n$`));
  });

  test("start-up refuses at once a file that is not a regular one (a FIFO, a device) or is far too large, naming it", async () => {
    // A FIFO nobody writes to would hold the start-up for ever (the command is killed after 90 s: the test fails).
    const fifo = join(dir, "cert.fifo");
    execFileSync("mkfifo", [fifo]);
    const data = tempDir();
    const served = await perch(["serve"], {
      PERCH_TLS_CERT_FILE: fifo,
      PERCH_TLS_KEY_FILE: certificate.key_file,
      PERCH_DATA_DIR: data,
      PERCH_PORT: "0",
      PERCH_HOST: "127.0.0.1",
    });
    rmSync(data, { recursive: true, force: true });
    assertFails(served, new RegExp(`^perch: tls\\.cert_file ${fifo} is not a regular file\\n$`));
    const big = join(dir, "big-key.pem");
    writeFileSync(big, Buffer.alloc(2 << 20, 0x41));
    await assert.rejects(startTestServer({ config: { tls: { ...certificate, key_file: big } } }), new RegExp(`tls\\.key_file ${big} is over 1 MiB`));
  });
});

describe("the tour with the port moved in ./perch.yaml and HTTPS", () => {
  const dir = tempDir();
  let server: ServerProcess;
  let port: number;
  before(async () => {
    port = await freeTcpPort();
    const tls = selfSigned(dir, "perch-box.lan");
    writeFileSync(
      join(dir, "perch.yaml"),
      [
        `port: ${port}`,
        "host: 127.0.0.1",
        `public_endpoint: perch-box.lan:${port}`,
        "data_dir: ./data",
        `tls: { cert_file: ${tls.cert_file}, key_file: ${tls.key_file} }`,
        "",
      ].join("\n"),
    );
    const pair = generateKeyPair();
    writeFileSync(join(dir, "device.json"), JSON.stringify({ public_key: encodeKey(pair.publicKey), private_key: encodeKey(pair.privateKey) }));
    server = await spawnServer({}, { cwd: dir });
  });
  after(async () => {
    await server?.stop();
    rmSync(dir, { recursive: true, force: true });
  });

  test("the server and the commands read ./perch.yaml: its port, HTTPS, and a pairing link that says https", async () => {
    assert.equal(server.url, `https://127.0.0.1:${port}`);
    const unset = { PERCH_CONFIG: undefined, PERCH_PORT: undefined };
    const out = await perchJson<{ token: string; link: string }>(["device", "--key-file", "device.json", "token"], unset, dir);
    assert.equal(out.link, `https://perch-box.lan:${port}/app/#token=${out.token}`);
    const status = await perchJson<Record<string, unknown>>(["device", "--key-file", "device.json", "status"], unset, dir);
    assert.deepEqual(status, {});
  });

  test("--server and the variables still win over the file", async () => {
    const closed = await freeTcpPort();
    const bySwitch = await perch(["device", "--server", `http://127.0.0.1:${closed}`, "--key-file", "device.json", "status"], { PERCH_CONFIG: undefined }, dir);
    assert.equal(bySwitch.code, 1);
    assert.match(bySwitch.stderr, new RegExp(`127\\.0\\.0\\.1:${closed}`));
    const byVariable = await perch(["device", "--key-file", "device.json", "status"], { PERCH_CONFIG: undefined, PERCH_PORT: String(closed) }, dir);
    assert.equal(byVariable.code, 1);
    assert.match(byVariable.stderr, new RegExp(`127\\.0\\.0\\.1:${closed}`));
    // PERCH_CONFIG set empty: no file, the defaults (port 8080, plain HTTP).
    const none = await perch(["device", "--key-file", "device.json", "token"], { PERCH_CONFIG: "", PERCH_PORT: String(closed) }, dir);
    assert.match(none.stderr, new RegExp(`http://127\\.0\\.0\\.1:${closed}`));
  });
});
