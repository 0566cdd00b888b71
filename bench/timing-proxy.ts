/**
 * A pass-through HTTP proxy that times each request it forwards: from the request's arrival to the
 * upstream's first response byte (its own time to first byte) and to the response's end. The
 * voice benchmark puts it between Perch and its speech provider, to tell the provider's time from
 * Perch's own.
 */
import http from "node:http";
import type { AddressInfo } from "node:net";

export interface Timing {
  path: string;
  status: number;
  firstByteMs: number;
  totalMs: number;
}

export async function startTimingProxy(target: string): Promise<{ url: string; timings: Timing[]; close(): Promise<void> }> {
  const to = new URL(target);
  const timings: Timing[] = [];
  const agent = new http.Agent({ keepAlive: true, maxSockets: 256 });
  const server = http.createServer((req, res) => {
    const start = performance.now();
    const upstream = http.request({ hostname: to.hostname, port: to.port, path: req.url, method: req.method, headers: req.headers, agent }, (answer) => {
      res.writeHead(answer.statusCode ?? 502, answer.headers);
      let first: number | undefined;
      answer.on("data", (chunk: Buffer) => {
        first ??= performance.now() - start;
        res.write(chunk);
      });
      answer.on("end", () => {
        res.end();
        timings.push({ path: req.url ?? "", status: answer.statusCode ?? 0, firstByteMs: first ?? Number.NaN, totalMs: performance.now() - start });
      });
      answer.on("error", () => res.destroy());
    });
    upstream.on("error", () => res.destroy());
    // Perch aborting a request (a barge-in, speech resuming) closes the upstream one too.
    res.on("close", () => {
      if (!res.writableFinished) upstream.destroy();
    });
    req.pipe(upstream);
  });
  await new Promise<void>((resolve) => server.listen(0, "127.0.0.1", resolve));
  return {
    url: `http://127.0.0.1:${(server.address() as AddressInfo).port}`,
    timings,
    close: async () => {
      server.closeAllConnections();
      await new Promise((resolve) => server.close(resolve));
      agent.destroy();
    },
  };
}
