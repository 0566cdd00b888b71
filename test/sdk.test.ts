/** The device SDK against answers that are not Perch's own: a proxy's HTML error page, a non-JSON success. */
import assert from "node:assert/strict";
import { createServer, type Server } from "node:http";
import type { AddressInfo } from "node:net";
import { after, before, describe, test } from "node:test";
import { generateKeyPair } from "../src/crypto/keys.ts";
import { PerchApiError, PerchClient } from "../src/sdk/client.ts";

describe("SDK: answers that are not JSON", () => {
  let proxy: Server;
  let url: string;
  before(async () => {
    // What a reverse proxy answers when Perch is down.
    proxy = createServer((req, res) => {
      if (req.url === "/server-info") {
        res.writeHead(200, { "content-type": "text/html" });
        res.end("<html><body>maintenance</body></html>");
        return;
      }
      res.writeHead(502, { "content-type": "text/html" });
      res.end("<html>\n<head><title>502 Bad Gateway</title></head>\n<body><center><h1>502 Bad Gateway</h1></center></body>\n</html>\n");
    });
    await new Promise<void>((resolve) => proxy.listen(0, "127.0.0.1", resolve));
    url = `http://127.0.0.1:${(proxy.address() as AddressInfo).port}`;
  });
  after(() => new Promise<void>((resolve) => proxy.close(() => resolve())));

  test("an HTML 502 is a PerchApiError with the status, not a SyntaxError", async () => {
    const client = new PerchClient({ baseUrl: url, keyPair: generateKeyPair() });
    client.accessToken = "anything";
    await assert.rejects(client.status(), (e: unknown) => {
      assert.ok(e instanceof PerchApiError, String(e));
      assert.equal(e.status, 502);
      assert.equal(e.code, "UNKNOWN");
      assert.match(e.message, /502 Bad Gateway/);
      assert.equal(e.headers?.get("content-type"), "text/html");
      return true;
    });
  });

  test("a success that is not JSON is a PerchApiError too", async () => {
    const client = new PerchClient({ baseUrl: url, keyPair: generateKeyPair() });
    await assert.rejects(client.serverInfo(), (e: unknown) => {
      assert.ok(e instanceof PerchApiError, String(e));
      assert.equal(e.status, 200);
      assert.equal(e.code, "INVALID_RESPONSE");
      return true;
    });
  });
});
