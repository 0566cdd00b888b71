import { createServer, type Server } from "node:http";
import type { AddressInfo } from "node:net";

/**
 * A collector for the benchmarks' traced servers: takes OTLP/HTTP exports at `/v1/traces` and
 * answers 200 at once (an empty `ExportTraceServiceResponse` is zero bytes), counting requests and
 * bytes. It runs in the benchmark's process, so its work is not the server's CPU (as a Collector's
 * is not).
 */
export class OtlpSink {
  requests = 0;
  bytes = 0;
  private readonly server: Server;

  private constructor(server: Server) {
    this.server = server;
  }

  static async start(): Promise<OtlpSink> {
    const server = createServer();
    const sink = new OtlpSink(server);
    server.on("request", (req, res) => {
      req.on("data", (c: Buffer) => {
        sink.bytes += c.length;
      });
      req.on("end", () => {
        sink.requests++;
        res.writeHead(200, { "content-type": "application/x-protobuf", "content-length": "0" }).end();
      });
    });
    await new Promise<void>((resolve) => server.listen(0, "127.0.0.1", resolve));
    return sink;
  }

  get endpoint(): string {
    return `http://127.0.0.1:${(this.server.address() as AddressInfo).port}`;
  }

  /** What it took, for a report. */
  figures(): { export_requests: number; bytes: number } {
    return { export_requests: this.requests, bytes: this.bytes };
  }

  close(): Promise<void> {
    this.server.closeAllConnections();
    return new Promise((resolve) => this.server.close(() => resolve()));
  }
}
