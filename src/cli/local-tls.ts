import { X509Certificate } from "node:crypto";
import { connect as netConnect, type Socket } from "node:net";
import { connect as tlsConnect } from "node:tls";
import { Agent, setGlobalDispatcher } from "undici";

/**
 * The command line talking to the server on this machine over HTTPS trusts exactly the certificate
 * that server is configured with (`tls.cert_file`), whoever issued it: a self-signed or `mkcert`
 * certificate works without adding its authority to Node's trust store, and nothing else is
 * accepted in its place. For this process's `fetch` (the SDK's requests and the WebRTC offer).
 */
export function trustOnlyCertificate(certPem: Buffer): void {
  const pinned = new X509Certificate(certPem).fingerprint256;
  setGlobalDispatcher(
    new Agent({
      connect: (o, done) => {
        let called = false;
        const once = (err: Error | null, socket: Socket | null) => {
          if (called) return;
          called = true;
          if (err) socket?.destroy();
          done(err, socket as never);
        };
        const port = Number(o.port) || (o.protocol === "https:" ? 443 : 80);
        if (o.protocol !== "https:") {
          const socket = netConnect({ host: o.hostname, port });
          socket.once("connect", () => once(null, socket));
          socket.once("error", (err) => once(err, socket));
          return;
        }
        // Verified by the pin below instead of by a certificate authority.
        const socket = tlsConnect({ host: o.hostname, port, rejectUnauthorized: false, ALPNProtocols: ["http/1.1"] });
        socket.once("secureConnect", () => {
          const peer = socket.getPeerX509Certificate();
          if (peer?.fingerprint256 === pinned) once(null, socket);
          else once(new Error(`the server at ${o.hostname}:${port} did not present the certificate of tls.cert_file`), socket);
        });
        socket.once("error", (err) => once(err, socket));
      },
    }),
  );
}
