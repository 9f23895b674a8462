/**
 * The address a client tool sends an API key and a signature to (GATEWAY_URL): `https://`, or
 * `http://` on this machine only (127.0.0.0/8, ::1, localhost). Anyone on an `http://` path to
 * another host reads the API key and can answer the challenge in the gateway's place (issue 28,
 * item 1). No message repeats the URL: it may carry a path or a port someone wants kept quiet.
 */

/** Whether `hostname` (as WHATWG URL parsing leaves it) names this machine's loopback. */
export function isLoopbackHost(hostname: string): boolean {
  const host = hostname.toLowerCase();
  if (host === "localhost" || host === "[::1]") return true;
  // The URL parser writes every IPv4 spelling (2130706433, 127.1, 0x7f.1) as a dotted quad.
  return /^127\.\d{1,3}\.\d{1,3}\.\d{1,3}$/.test(host);
}

/** What is wrong with `raw` as a GATEWAY_URL, or undefined when a client may call it. */
export function gatewayUrlProblem(raw: string): string | undefined {
  let url: URL;
  try {
    url = new URL(raw);
  } catch {
    return "GATEWAY_URL must be an https:// URL";
  }
  if (url.protocol !== "https:" && url.protocol !== "http:")
    return "GATEWAY_URL must be an https:// URL";
  if (url.username !== "" || url.password !== "")
    return "GATEWAY_URL must not carry a user or password (the API key goes in GATEWAY_API_KEY)";
  if (url.protocol === "http:" && !isLoopbackHost(url.hostname))
    return (
      "GATEWAY_URL must be an https:// URL (http:// only to this machine: 127.0.0.0/8, ::1, " +
      "localhost): the API key and the signature would cross the network in the clear"
    );
  return undefined;
}
