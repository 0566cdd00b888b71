import assert from "node:assert/strict";
import { rmSync, writeFileSync } from "node:fs";
import { createServer } from "node:net";
import { join } from "node:path";
import { after, before, describe, test } from "node:test";
import { ConfigError, loadConfig } from "../src/config/config.ts";
import { decodeKey, decodePrivateKey, encodeKey, generateKeyPair, keyPairFromPrivate } from "../src/crypto/keys.ts";
import { PerchApiError, PerchClient } from "../src/sdk/client.ts";
import { Store } from "../src/store/index.ts";
import { assertFails, perch, perchJson } from "./support/cli.ts";
import { STORES, spawnServer, startTestServer, type TestServer, tempDir } from "./support/server.ts";

function refused(status: number, code: string) {
  return (e: unknown) => {
    assert.ok(e instanceof PerchApiError, String(e));
    assert.equal(`${e.status} ${e.code}`, `${status} ${code}`);
    return true;
  };
}

type PeerListing = Array<{ public_key: string; role: string; status: string; created_at: string }>;
type SessionListing = Array<{ id: string; kind: string; public_key: string; target_key?: string; created_at: string; expires_at: string }>;

// The tests run at once (each is a row of command-line processes, most of their time a process
// starting); the voice test has a data directory of its own, since the peers test lists every peer.
describe("perch command line: keys and peers", { concurrency: true }, () => {
  const dataDir = tempDir();
  const env = { PERCH_DATA_DIR: dataDir };
  /** The same SQLite file, opened here to check what each command wrote. */
  let store: Store;
  before(async () => {
    store = await Store.open(undefined, dataDir);
  });
  after(async () => {
    await store.close();
    rmSync(dataDir, { recursive: true, force: true });
  });
  const statusOf = async (key: string) => (await store.read((r) => r.peers.get(key)))?.status;

  test("peers voice sets a device's voice agent (an agent id, off, default); an unknown agent or key exits 1", async (t) => {
    const voiceDir = tempDir();
    const voiceStore = await Store.open(undefined, voiceDir);
    t.after(async () => {
      await voiceStore.close();
      rmSync(voiceDir, { recursive: true, force: true });
    });
    const config = join(voiceDir, "voice.json");
    writeFileSync(
      config,
      JSON.stringify({
        providers: [{ id: "p", kind: "openai-compatible", base_url: "http://127.0.0.1:9/v1" }],
        models: [{ id: "m", kind: "chat", provider: "p", upstream_model: "x" }],
        agents: [{ id: "talker", model: "m" }],
      }),
    );
    const venv = { PERCH_DATA_DIR: voiceDir, PERCH_CONFIG: config };
    const key = encodeKey(generateKeyPair().publicKey);
    await perchJson(["peers", "add", key], venv);
    const voiceOf = () => voiceStore.read((r) => r.peers.voiceAgent(key));
    assert.deepEqual(await perchJson(["peers", "voice", key, "talker"], venv), { public_key: key, voice_agent: "talker" });
    assert.equal(await voiceOf(), "talker");
    await perchJson(["peers", "voice", key, "off"], venv);
    assert.equal(await voiceOf(), "off");
    await perchJson(["peers", "voice", key, "default"], venv);
    assert.equal(await voiceOf(), null);
    const [unknownAgent, unknownKey] = await Promise.all([
      perch(["peers", "voice", key, "nobody"], venv),
      perch(["peers", "voice", encodeKey(generateKeyPair().publicKey), "off"], venv),
    ]);
    assertFails(unknownAgent, /no agent nobody in the configuration \(agents: talker\)/);
    assertFails(unknownKey, /no registered peer/);
    assert.equal(await voiceOf(), null);
  });

  test("keygen prints a valid X25519 key pair", async () => {
    const pair = await perchJson<{ public_key: string; private_key: string }>(["keygen"], env);
    assert.deepEqual(Object.keys(pair).sort(), ["private_key", "public_key"]);
    const derived = keyPairFromPrivate(decodePrivateKey(pair.private_key));
    assert.equal(encodeKey(derived.publicKey), pair.public_key, "the public key belongs to the private key");
    assert.equal(decodeKey(pair.public_key).length, 32);
  });

  test("peers add, list, block, unblock, remove; unknown and invalid keys exit 1 and change nothing", async () => {
    const key = encodeKey(generateKeyPair().publicKey);
    const admin = encodeKey(generateKeyPair().publicKey);
    const unknown = encodeKey(generateKeyPair().publicKey);

    assert.deepEqual(await perchJson(["peers", "add", key], env), { public_key: key, added: true });
    const [again, addedAdmin] = await Promise.all([perchJson(["peers", "add", ` ${key} `], env), perchJson(["peers", "add", "--role", "admin", admin], env)]);
    assert.deepEqual(again, { public_key: key, added: false }, "a second add changes nothing");
    assert.deepEqual(addedAdmin, { public_key: admin, added: true });
    assert.equal((await store.read((r) => r.peers.get(admin)))?.role, "admin");

    assert.deepEqual(await perchJson(["peers", "block", key], env), { public_key: key, status: "blocked" });
    assert.equal(await statusOf(key), "blocked");
    const list = await perchJson<PeerListing>(["peers", "list"], env);
    assert.deepEqual(
      list.map((p) => [p.public_key, p.role, p.status]),
      [
        [key, "client", "blocked"],
        [admin, "admin", "active"],
      ],
    );
    assert.equal(Date.parse(list[0]!.created_at), (await store.read((r) => r.peers.get(key)))?.created_at);

    assert.deepEqual(await perchJson(["peers", "unblock", key], env), { public_key: key, status: "active" });
    assert.equal(await statusOf(key), "active");
    assert.deepEqual(await perchJson(["peers", "remove", key], env), { public_key: key, removed: true });
    assert.equal(await store.read((r) => r.peers.get(key)), undefined);

    const [remove, block, addInvalid, badRole, after] = await Promise.all([
      perch(["peers", "remove", key], env),
      perch(["peers", "block", unknown], env),
      perch(["peers", "add", "not-a-key"], env),
      perch(["peers", "add", "--role", "root", unknown], env),
      perchJson<PeerListing>(["peers", "list"], env),
    ]);
    assertFails(remove, new RegExp(`no registered peer ${key}`));
    assertFails(block, new RegExp(`no registered peer ${unknown}`));
    assertFails(addInvalid, /not a base58 X25519 public key: not-a-key/);
    assertFails(badRole, /--role must be client or admin/);
    assert.deepEqual(
      after.map((p) => [p.public_key, p.status]),
      [[admin, "active"]],
    );
    assert.equal(await store.read((r) => r.peers.get(unknown)), undefined);
  });
});

for (const store of STORES) {
  describe(`perch command line: sessions, next to a running server (${store.name})`, () => {
    const dataDir = tempDir();
    let env: Record<string, string>;
    let server: TestServer;
    before(async () => {
      const databaseUrl = await store.url();
      env = { PERCH_DATA_DIR: dataDir, ...(databaseUrl ? { PERCH_DATABASE_URL: databaseUrl } : {}) };
      server = await startTestServer({ dataDir, config: { database_url: databaseUrl } });
    });
    after(async () => {
      await server.stop();
      rmSync(dataDir, { recursive: true, force: true });
    });

    test("sessions list shows logins; sessions revoke and peers remove end them on the running server", async () => {
      const device = server.client();
      const primary = await device.login();
      const phone = server.client();
      const sc = await phone.login({ deviceToken: (await device.createDeviceToken()).token });

      const listed = await perchJson<SessionListing>(["sessions", "list"], env);
      const byId = new Map(listed.map((s) => [s.id, s]));
      assert.equal(listed.length, 2);
      assert.deepEqual(
        { ...byId.get(primary.session_id)!, created_at: "", expires_at: "" },
        { id: primary.session_id, kind: "primary", public_key: device.publicKey, created_at: "", expires_at: "" },
      );
      assert.deepEqual(
        { ...byId.get(sc.session_id)!, created_at: "", expires_at: "" },
        { id: sc.session_id, kind: "side_control", public_key: phone.publicKey, target_key: device.publicKey, created_at: "", expires_at: "" },
      );
      assert.equal(Date.parse(byId.get(primary.session_id)!.expires_at), primary.expires_at);
      assert.ok(!JSON.stringify(listed).includes(primary.access_token), "no bearer token in the listing");

      assert.deepEqual(await perchJson(["sessions", "revoke", primary.session_id], env), { id: primary.session_id, revoked: true });
      await assert.rejects(device.me(), refused(401, "INVALID_SESSION"));
      assert.deepEqual(await phone.sideControl.status(), {}, "other sessions are untouched");
      assertFails(await perch(["sessions", "revoke", primary.session_id], env), /no live session/);
      assert.deepEqual(
        (await perchJson<SessionListing>(["sessions", "list"], env)).map((s) => s.id),
        [sc.session_id],
      );

      // Removing the device through the command line ends the Side Control session aimed at it.
      assert.deepEqual(await perchJson(["peers", "remove", device.publicKey], env), { public_key: device.publicKey, removed: true });
      await assert.rejects(phone.sideControl.status(), refused(401, "INVALID_SESSION"));
      assert.equal(await server.store.read((r) => r.peers.get(device.publicKey)), undefined);
    });
  });

  describe(`registration policies (${store.name})`, () => {
    const servers: TestServer[] = [];
    after(() => Promise.all(servers.map((s) => s.stop())));
    const start = async (registration: { policy: "open" | "token" | "closed"; tokens?: string[] }) => {
      const server = await startTestServer({ config: { database_url: await store.url(), registration } });
      servers.push(server);
      return server;
    };

    test("open: a primary login registers a new key as an active client", async () => {
      const server = await start({ policy: "open" });
      const device = server.client();
      assert.equal(await server.store.read((r) => r.peers.get(device.publicKey)), undefined);
      await device.login();
      const me = await device.me();
      assert.deepEqual([me.public_key, me.role, me.registration_status], [device.publicKey, "client", "active"]);
    });

    test("token: a new key needs a configured X-Registration-Token; registered keys do not", async () => {
      const server = await start({ policy: "token", tokens: ["first-token", "second-token"] });
      const device = server.client();
      const assertion = await device.assertion();
      await assert.rejects(device.login({ assertion }), refused(401, "REGISTRATION_REQUIRED"));
      await assert.rejects(device.login({ assertion, registrationToken: "wrong-token" }), refused(401, "REGISTRATION_REQUIRED"));
      await assert.rejects(device.login({ assertion, registrationToken: "first-token-" }), refused(401, "REGISTRATION_REQUIRED"));
      assert.equal(await server.store.read((r) => r.peers.get(device.publicKey)), undefined, "a refused login registers nothing");
      assert.equal(device.accessToken, undefined);

      // The refused logins did not use up the assertion's nonce either.
      await device.login({ assertion, registrationToken: "second-token" });
      assert.equal((await device.me()).registration_status, "active");
      await device.login();
      assert.equal((await device.me()).public_key, device.publicKey, "a registered key logs in without a token");

      const added = server.client();
      assert.equal(await server.domain.peers.add(added.publicKey), true);
      await added.login();
      assert.equal((await added.me()).role, "client");

      // Side Control logins need no registration token and register nobody.
      const phone = server.client();
      await phone.login({ deviceToken: (await device.createDeviceToken()).token });
      assert.deepEqual(await phone.sideControl.info(), {});
      assert.equal(await server.store.read((r) => r.peers.get(phone.publicKey)), undefined);
    });

    test("closed: only operator-added keys log in; Side Control controllers need not be registered", async () => {
      const server = await start({ policy: "closed" });
      const stranger = server.client();
      await assert.rejects(stranger.login(), refused(403, "PEER_NOT_REGISTERED"));
      await assert.rejects(stranger.login({ registrationToken: "anything" }), refused(403, "PEER_NOT_REGISTERED"));
      assert.equal(await server.store.read((r) => r.peers.get(stranger.publicKey)), undefined);

      const device = server.client();
      assert.equal(await server.domain.peers.add(device.publicKey), true);
      assert.equal(await server.domain.peers.add(device.publicKey), false);
      await device.login();
      await device.putStatus({ volume: 3 });

      const phone = server.client();
      const sc = await phone.login({ deviceToken: (await device.createDeviceToken()).token });
      assert.equal(sc.grant_type, "side_control");
      assert.equal((await phone.sideControl.status()).volume, 3);
      assert.equal(await server.store.read((r) => r.peers.get(phone.publicKey)), undefined, "the controller was not registered");
      await assert.rejects(new PerchClient({ baseUrl: server.url, keyPair: phone.keyPair }).login(), refused(403, "PEER_NOT_REGISTERED"));
    });
  });

  describe(`blocked and removed peers (${store.name})`, () => {
    let server: TestServer;
    before(async () => {
      server = await startTestServer({ config: { database_url: await store.url() } });
    });
    after(() => server.stop());

    /** Every bearer route, as [method, path, body]. */
    const primaryRoutes = (tokenId: string, sessionId: string): Array<[string, string, unknown?]> => [
      ["GET", "/me"],
      ["GET", "/me/status"],
      ["PUT", "/me/status", { volume: 99 }],
      ["GET", "/me/runtime"],
      ["POST", "/me/side-control/device-tokens"],
      ["DELETE", `/me/side-control/device-tokens/${tokenId}`],
      ["GET", "/me/side-control/sessions"],
      ["DELETE", `/me/side-control/sessions/${sessionId}`],
    ];
    const sideControlRoutes: Array<[string, string, unknown?]> = [
      ["GET", "/side-control/info"],
      ["GET", "/side-control/runtime"],
      ["GET", "/side-control/status"],
      ["GET", "/side-control/telemetry/latest"],
      ["GET", "/side-control/telemetry?field=battery.percent"],
      ["GET", "/side-control/telemetry/aggregate?field=battery.percent&bucket_ms=60000&aggregate=avg"],
      ["GET", "/side-control/contacts"],
      ["POST", "/side-control/contacts", { name: "new", phone_number: "+1 555 0199" }],
      ["GET", "/side-control/contacts/mom"],
      ["PUT", "/side-control/contacts/mom", { display_name: "Changed" }],
      ["DELETE", "/side-control/contacts/mom"],
    ];
    async function expectEverywhere(c: PerchClient, routes: Array<[string, string, unknown?]>, status: number, code: string) {
      for (const [method, path, body] of routes) {
        await assert.rejects(c.request(method, path, body === undefined ? {} : { body }), refused(status, code), `${method} ${path}`);
      }
    }

    test("a blocked device is refused on login and on every bearer route; unblocking restores it unchanged", async () => {
      const device = server.client();
      await device.login();
      const status = await device.putStatus({ volume: 10 });
      const phone = server.client();
      const sc = await phone.login({ deviceToken: (await device.createDeviceToken()).token });
      await phone.sideControl.contacts.create({ name: "mom", display_name: "Mom" });
      const spare = await device.createDeviceToken();
      const withdrawable = await device.createDeviceToken();

      assert.equal(await server.domain.peers.setBlocked(device.publicKey, true), true);
      await assert.rejects(device.login({ assertion: await device.assertion() }), refused(403, "PEER_BLOCKED"));
      await expectEverywhere(device, primaryRoutes(withdrawable.id, sc.session_id), 403, "PEER_BLOCKED");
      await expectEverywhere(phone, sideControlRoutes, 403, "PEER_BLOCKED");
      const late = server.client();
      const lateAssertion = await late.assertion();
      await assert.rejects(late.login({ deviceToken: spare.token, assertion: lateAssertion }), refused(403, "PEER_BLOCKED"));
      assert.equal((await server.store.read((r) => r.peers.get(device.publicKey)))?.status, "blocked");

      assert.equal(await server.domain.peers.setBlocked(device.publicKey, false), true);
      assert.equal((await device.me()).registration_status, "active");
      assert.deepEqual(await device.status(), status, "the refused PUT wrote nothing");
      assert.deepEqual(
        (await phone.sideControl.contacts.list()).items.map((c) => [c.name, c.display_name]),
        [["mom", "Mom"]],
        "the refused contact writes changed nothing",
      );
      assert.deepEqual(
        (await device.sideControlSessions()).items.map((s) => s.id),
        [sc.session_id],
        "the refused DELETE revoked nothing",
      );
      await device.revokeDeviceToken(withdrawable.id);
      // Neither the refused Side Control login's token nor its assertion was used up.
      assert.equal((await late.login({ deviceToken: spare.token, assertion: lateAssertion })).grant_type, "side_control");
    });

    test("a blocked controller is refused on Side Control logins and sessions", async () => {
      const device = server.client();
      await device.login();
      const phone = server.client();
      await phone.login(); // registers the controller as a peer of its own
      const primaryBearer = phone.accessToken;
      await phone.login({ deviceToken: (await device.createDeviceToken()).token });
      assert.deepEqual(await phone.sideControl.status(), {});

      await server.domain.peers.setBlocked(phone.publicKey, true);
      await expectEverywhere(phone, sideControlRoutes, 403, "PEER_BLOCKED");
      await assert.rejects(phone.request("GET", "/me", { bearer: primaryBearer! }), refused(403, "PEER_BLOCKED"));
      const token = await device.createDeviceToken();
      await assert.rejects(phone.login({ deviceToken: token.token }), refused(403, "PEER_BLOCKED"));

      await server.domain.peers.setBlocked(phone.publicKey, false);
      assert.deepEqual(await phone.sideControl.status(), {});
      assert.equal((await phone.login({ deviceToken: token.token })).grant_type, "side_control");
    });

    test("removing a peer ends its sessions and the Side Control sessions aimed at it", async () => {
      const device = server.client();
      await device.login();
      await device.putStatus({ volume: 70 });
      const phone = server.client();
      await phone.login({ deviceToken: (await device.createDeviceToken()).token });
      const spare = await device.createDeviceToken();

      assert.equal(await server.domain.peers.remove(device.publicKey), true);
      await expectEverywhere(device, primaryRoutes("x", "y"), 401, "INVALID_SESSION");
      await expectEverywhere(phone, sideControlRoutes, 401, "INVALID_SESSION");
      await assert.rejects(server.client().login({ deviceToken: spare.token }), refused(401, "INVALID_DEVICE_TOKEN"));
      assert.equal(await server.domain.peers.remove(device.publicKey), false);

      // Under policy open the key may come back, with nothing of its old state.
      await device.login();
      assert.deepEqual(await device.status(), {});
      assert.deepEqual((await device.sideControlSessions()).items, []);
    });
  });
}

describe("configuration files and environment", () => {
  const dir = tempDir();
  after(() => rmSync(dir, { recursive: true, force: true }));
  const file = (name: string, text: string) => {
    const path = join(dir, name);
    writeFileSync(path, text);
    return path;
  };
  const freePort = () =>
    new Promise<number>((resolve, reject) => {
      const s = createServer().listen(0, "127.0.0.1", () => {
        const { port } = s.address() as { port: number };
        s.close(() => resolve(port));
      });
      s.once("error", reject);
    });

  const yaml = file(
    "perch.yaml",
    [
      "port: 9123",
      "host: 127.0.0.1",
      "nodeName: yaml-node",
      "publicEndpoint: yaml.example:443",
      "registration:",
      "  policy: token",
      "  tokens: [abc, def]",
      "rateLimits:",
      "  loginPerKey: 5",
      "",
    ].join("\n"),
  );
  const json = file(
    "perch.json",
    JSON.stringify({ port: 9124, nodeName: "json-node", registration: { policy: "closed" }, rateLimits: { deviceTokenPerDevice: 7 } }),
  );

  test("a YAML or JSON file sets the configuration; environment variables win, field by field", () => {
    const fromYaml = loadConfig({ PERCH_CONFIG: yaml });
    assert.deepEqual(
      [fromYaml.port, fromYaml.host, fromYaml.node_name, fromYaml.public_endpoint, fromYaml.registration],
      [9123, "127.0.0.1", "yaml-node", "yaml.example:443", { policy: "token", tokens: ["abc", "def"] }],
    );
    assert.deepEqual(fromYaml.rate_limits, { login_per_key: 5, login_per_address: 600, device_token_per_device: 30, offer_per_key: 30 });

    const fromJson = loadConfig({ PERCH_CONFIG: json });
    assert.deepEqual(
      [fromJson.port, fromJson.host, fromJson.node_name, fromJson.registration, fromJson.rate_limits.device_token_per_device],
      [9124, "0.0.0.0", "json-node", { policy: "closed", tokens: [] }, 7],
    );

    const overridden = loadConfig({ PERCH_CONFIG: yaml, PERCH_PORT: "9200", PERCH_REGISTRATION_POLICY: "closed", PERCH_NODE_NAME: "env-node" });
    assert.deepEqual(
      [overridden.port, overridden.node_name, overridden.registration, overridden.public_endpoint],
      [9200, "env-node", { policy: "closed", tokens: ["abc", "def"] }, "yaml.example:443"],
    );
    assert.deepEqual(loadConfig({ PERCH_CONFIG: yaml, PERCH_REGISTRATION_TOKENS: "x,y" }).registration, { policy: "token", tokens: ["x", "y"] });
    assert.equal(loadConfig({ PERCH_CONFIG: json, PERCH_REGISTRATION_POLICY: "open" }).registration.policy, "open");
  });

  test("perch serve follows a YAML file: port, endpoint, registration tokens, rate limits", async () => {
    const port = await freePort();
    const config = file(
      "serve.yaml",
      `port: ${port}\nhost: 127.0.0.1\npublicEndpoint: perch.example:443\nregistration:\n  policy: token\n  tokens: [abc]\nrateLimits:\n  loginPerKey: 2\n`,
    );
    // Empty PERCH_PORT / PERCH_HOST count as unset, so the file's values apply.
    const node = await spawnServer({ PERCH_DATA_DIR: join(dir, "yaml-data"), PERCH_CONFIG: config, PERCH_PORT: "", PERCH_HOST: "" });
    try {
      assert.equal(node.url, `http://127.0.0.1:${port}`);
      const c = () => new PerchClient({ baseUrl: node.url, keyPair: generateKeyPair() });
      assert.equal((await c().serverInfo()).endpoint, "perch.example:443");

      await assert.rejects(c().login(), refused(401, "REGISTRATION_REQUIRED"));
      const device = c();
      await device.login({ registrationToken: "abc" });
      await device.login();
      await assert.rejects(device.login(), (e: unknown) => {
        refused(429, "RATE_LIMITED")(e);
        assert.ok(Number((e as PerchApiError).headers?.get("retry-after")) > 0);
        return true;
      });
    } finally {
      assert.equal(await node.stop(), 0);
    }
  });

  test("perch serve: environment variables override a JSON file", async () => {
    const config = file("serve.json", JSON.stringify({ nodeName: "json-node", publicEndpoint: "json.example:1", registration: { policy: "closed" } }));
    const node = await spawnServer({
      PERCH_DATA_DIR: join(dir, "json-data"),
      PERCH_CONFIG: config,
      PERCH_REGISTRATION_POLICY: "open",
      PERCH_PUBLIC_ENDPOINT: "env.example:2",
    });
    try {
      const device = new PerchClient({ baseUrl: node.url, keyPair: generateKeyPair() });
      assert.equal((await device.serverInfo()).endpoint, "env.example:2");
      await device.login();
      assert.equal((await device.me()).registration_status, "active", "policy open from the environment");
      assert.match(node.output(), /"node":"json-node"/, "settings the environment does not set still come from the file");
    } finally {
      assert.equal(await node.stop(), 0);
    }
  });

  test("an invalid configuration is refused with a message naming the setting or file", () => {
    const refusedConfig = (env: NodeJS.ProcessEnv, message: RegExp) =>
      assert.throws(
        () => loadConfig(env),
        (e: unknown) => e instanceof ConfigError && message.test(e.message),
      );
    refusedConfig({ PERCH_CONFIG: file("bad-policy.yaml", "registration:\n  policy: maybe\n") }, /registration\.policy/);
    refusedConfig({ PERCH_CONFIG: yaml, PERCH_REGISTRATION_POLICY: "maybe" }, /registration\.policy/);
    refusedConfig({ PERCH_PORT: "eighty" }, /^invalid configuration at port/);
    refusedConfig({ PERCH_CONFIG: file("bad-limit.json", JSON.stringify({ rateLimits: { loginPerKey: -1 } })) }, /rate_limits\.login_per_key/);
    refusedConfig({ PERCH_CONFIG: file("bad-key.json", JSON.stringify({ prot: 8080 })) }, /"prot"/);
    refusedConfig({ PERCH_CONFIG: file("broken.yaml", "port: [1\n") }, /broken\.yaml/);
    refusedConfig({ PERCH_CONFIG: file("list.yaml", "- port\n") }, /list\.yaml must hold an object/);
    refusedConfig({ PERCH_CONFIG: join(dir, "missing.yaml") }, /cannot read config file .*missing\.yaml/);
  });

  test("perch serve with an invalid configuration exits 1 with the message on stderr", async () => {
    const base = { PERCH_DATA_DIR: join(dir, "bad-data"), PERCH_PORT: "0", PERCH_HOST: "127.0.0.1" };
    const [policy, malformed] = await Promise.all([
      perch(["serve"], { ...base, PERCH_CONFIG: file("serve-bad-policy.yaml", "registration:\n  policy: maybe\n") }),
      perch(["serve"], { ...base, PERCH_CONFIG: file("broken.json", '{"port": ') }),
    ]);
    assertFails(policy, /invalid configuration at registration\.policy/);
    assertFails(malformed, /config file .*broken\.json cannot be parsed/);
    for (const r of [policy, malformed]) assert.doesNotMatch(r.stderr, /\n\s+at /, "a message, not a stack trace");
  });
});
