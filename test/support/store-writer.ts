// A second process on the same SQLite file, as `perch peers …` is: it opens its own Store and
// commits peer changes in a loop for `ms` milliseconds. Usage: store-writer.ts <dataDir> <ms>
import { encodeKey, generateKeyPair } from "../../src/crypto/keys.ts";
import { Store } from "../../src/store/index.ts";

const [dataDir, ms] = process.argv.slice(2);
const store = await Store.open(undefined, dataDir!, { readWorkers: 0 });
const key = encodeKey(generateKeyPair().publicKey);
const peer = { public_key: key, role: "client", status: "active", device_info: "{}", created_at: 1, updated_at: 1 };
await store.transaction((tx) => tx.peers.register(peer));
let commits = 0;
for (const until = Date.now() + Number(ms); Date.now() < until; commits++) {
  await store.transaction((tx) => tx.peers.setStatus(key, commits % 2 ? "active" : "blocked", Date.now()));
}
await store.close();
process.stdout.write(`${JSON.stringify({ commits })}\n`);
