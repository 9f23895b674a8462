import { promises as dns } from "node:dns";
import { isIP } from "node:net";
import ipaddr from "ipaddr.js";
import { GatewayError } from "../../domain/errors.js";

/**
 * Provider endpoints are secrets chosen by a third party, and the gateway connects to them from
 * inside its own network. This module is the one place that decides which endpoint URLs are
 * acceptable and which addresses the gateway may connect to, so that a registered endpoint
 * cannot be turned against the gateway's own network (SSRF): loopback, private networks, cloud
 * metadata services and the like are refused, both when an endpoint is registered and again
 * every time a connection is opened.
 *
 * No error or log line produced here contains the URL or its host: the endpoint is the
 * provider's secret.
 */

/** Longer endpoint URLs are refused: no real endpoint needs one, and the URL is signed. */
export const maxEndpointUrlLength = 2048;

/**
 * The canonical form of a provider endpoint URL.
 *
 * The provider signs `keccak256(utf8(canonical))` in its registration challenge, and the gateway
 * recomputes that hash from the URL it receives, so this must be deterministic and idempotent
 * (`canonical(canonical(x)) === canonical(x)`): two spellings of one endpoint yield one string.
 * It is the WHATWG URL serialisation (lower-case host, default port dropped, IPv4 shorthands
 * such as `http://2130706433/` written as `127.0.0.1`, IPv6 compressed, percent-encoding as the
 * URL standard leaves it) with trailing slashes removed from the path (`/base/` and `/base`
 * are one endpoint; a bare `/` stays) and an empty query (`?`) dropped.
 *
 * Refused with `invalid_request`: anything that is not an absolute `http:`/`https:` URL, user
 * info (credentials belong in the endpoint token, which is stored sealed), a fragment, and
 * URLs longer than {@link maxEndpointUrlLength}. The messages never repeat the URL.
 */
export function canonicalEndpointUrl(input: string): string {
  if (input.length > maxEndpointUrlLength) {
    throw new GatewayError(
      "invalid_request",
      `endpoint URL is longer than ${maxEndpointUrlLength} characters`,
    );
  }
  let url: URL;
  try {
    url = new URL(input);
  } catch {
    throw new GatewayError("invalid_request", "endpoint URL is not a valid absolute URL");
  }
  if (url.protocol !== "http:" && url.protocol !== "https:") {
    throw new GatewayError("invalid_request", "endpoint URL must use http or https");
  }
  if (url.username !== "" || url.password !== "") {
    throw new GatewayError(
      "invalid_request",
      "endpoint URL must not contain user info; pass credentials as the endpoint token",
    );
  }
  // `url.hash` is "" both without a fragment and with an empty one (`/#`), so look at the
  // serialisation.
  if (url.href.includes("#")) {
    throw new GatewayError("invalid_request", "endpoint URL must not contain a fragment");
  }
  const path = url.pathname.replace(/\/+$/, "");
  url.pathname = path === "" ? "/" : path;
  if (url.search === "") url.search = "";
  const canonical = url.href;
  if (canonical.length > maxEndpointUrlLength) {
    throw new GatewayError(
      "invalid_request",
      `endpoint URL is longer than ${maxEndpointUrlLength} characters`,
    );
  }
  return canonical;
}

// The IPv6 global unicast space (IANA): anything outside it that ipaddr.js still calls
// "unicast" is unassigned, and nothing legitimate lives there.
const globalUnicast6 = ipaddr.IPv6.parseCIDR("2000::/3");
// The well-known NAT64 prefix (RFC 6052): a DNS64 resolver returns 64:ff9b::a.b.c.d for an
// IPv4-only host, so the embedded IPv4 address decides. The local-use NAT64 prefix
// 64:ff9b:1::/48 (RFC 8215) is site-specific and refused outright.
const wellKnownNat64 = ipaddr.IPv6.parseCIDR("64:ff9b::/96");

/**
 * Whether the gateway may connect to `ip` (an IPv4 or IPv6 address in text form, as DNS or a
 * URL gives it). Only public unicast addresses pass. Refused, among others: loopback, private
 * networks (10/8, 172.16/12, 192.168/16, fc00::/7), link-local (169.254/16, fe80::/10) and
 * with it the cloud metadata services (169.254.169.254, fd00:ec2::254), carrier-grade NAT
 * (100.64/10), unspecified (0.0.0.0/8, ::), broadcast, multicast, documentation, benchmarking
 * and reserved ranges, and zone-scoped IPv6. IPv6 forms that embed an IPv4 address
 * (IPv4-mapped `::ffff:a.b.c.d`, IPv4-translated, NAT64 `64:ff9b::/96`, 6to4 `2002::/16`) are
 * judged by the embedded address; Teredo is refused (its embedded addresses are obfuscated
 * and nobody serves a model over it). Anything that does not parse is refused.
 */
export function isAllowedAddress(ip: string): boolean {
  if (!ipaddr.isValid(ip) || isIP(ip) === 0) return false;
  let addr: ipaddr.IPv4 | ipaddr.IPv6;
  try {
    addr = ipaddr.parse(ip);
  } catch {
    return false;
  }
  return addr.kind() === "ipv4"
    ? isAllowedIPv4(addr as ipaddr.IPv4)
    : isAllowedIPv6(addr as ipaddr.IPv6);
}

function isAllowedIPv4(addr: ipaddr.IPv4): boolean {
  return addr.range() === "unicast";
}

function isAllowedIPv6(addr: ipaddr.IPv6): boolean {
  if (addr.zoneId !== undefined) return false;
  const parts = addr.parts;
  switch (addr.range()) {
    case "ipv4Mapped":
    case "rfc6145":
      return isAllowedIPv4(embeddedIPv4(parts[6], parts[7]));
    case "rfc6052":
      return addr.match(wellKnownNat64) && isAllowedIPv4(embeddedIPv4(parts[6], parts[7]));
    case "6to4":
      return isAllowedIPv4(embeddedIPv4(parts[1], parts[2]));
    case "unicast":
      return addr.match(globalUnicast6);
    default:
      return false;
  }
}

function embeddedIPv4(high: number | undefined, low: number | undefined): ipaddr.IPv4 {
  const h = high ?? 0;
  const l = low ?? 0;
  return new ipaddr.IPv4([h >> 8, h & 0xff, l >> 8, l & 0xff]);
}

/** A DNS lookup returning every address of a name, like `dns.promises.lookup(host, {all: true})`. */
export type LookupAll = (hostname: string) => Promise<{ address: string; family: number }[]>;

const systemLookup: LookupAll = (hostname) => dns.lookup(hostname, { all: true });

export interface ResolveEndpointOptions {
  /** Let loopback and private addresses through: local development and tests only. */
  allowPrivate: boolean;
  /** Replaces the system resolver (tests). */
  lookup?: LookupAll | undefined;
}

export interface ResolvedEndpoint {
  /** The canonical endpoint URL, parsed. */
  url: URL;
  /** The address to connect to: the first one the resolver returned. */
  address: string;
  family: 4 | 6;
}

/**
 * Resolves an endpoint URL to the address the gateway will connect to, refusing
 * (`endpoint_not_allowed`) when the host is, or resolves to, an address that
 * {@link isAllowedAddress} refuses. Every resolved address must pass, not only the one used:
 * a name that resolves to one public and one private address is a rebinding attempt.
 * A name that does not resolve gives `upstream_unavailable`. The URL is validated and
 * canonicalised first (`invalid_request`).
 *
 * Callers connect to the returned `address`, never to the name again, so that what was
 * checked is what is used (a DNS answer that changes between check and connect cannot
 * redirect the gateway).
 */
export async function resolveEndpoint(
  endpointUrl: string,
  opts: ResolveEndpointOptions,
): Promise<ResolvedEndpoint> {
  const url = new URL(canonicalEndpointUrl(endpointUrl));
  const resolved = await resolveHost(hostOf(url), opts);
  return { url, ...resolved };
}

/**
 * Registration's check of an endpoint (src/domain/registration/ `checkEndpoint`): it resolves,
 * and to allowed addresses only ({@link resolveEndpoint}); throws otherwise.
 */
export function createEndpointCheck(
  opts: ResolveEndpointOptions,
): (canonicalUrl: string) => Promise<void> {
  return async (url) => {
    await resolveEndpoint(url, opts);
  };
}

/**
 * Resolves and checks one host name or IP literal (without brackets); see
 * {@link resolveEndpoint}. Used by the upstream client at connect time.
 */
export async function resolveHost(
  host: string,
  opts: ResolveEndpointOptions,
): Promise<{ address: string; family: 4 | 6 }> {
  let addresses: { address: string; family: number }[];
  const literal = isIP(host);
  if (literal !== 0) {
    addresses = [{ address: host, family: literal }];
  } else {
    try {
      addresses = await (opts.lookup ?? systemLookup)(host);
    } catch (err) {
      // The resolver's error names the host, so only its code is kept.
      throw new GatewayError("upstream_unavailable", "endpoint host could not be resolved", {
        cause: sanitizedCause(err),
      });
    }
  }
  const first = addresses[0];
  if (first === undefined) {
    throw new GatewayError("upstream_unavailable", "endpoint host could not be resolved");
  }
  if (!opts.allowPrivate && !addresses.every((a) => isAllowedAddress(a.address))) {
    throw new GatewayError(
      "endpoint_not_allowed",
      "endpoint host resolves to a non-public address",
    );
  }
  const family = isIP(first.address);
  if (family !== 4 && family !== 6) {
    throw new GatewayError("upstream_unavailable", "endpoint host could not be resolved");
  }
  return { address: first.address, family };
}

/** The host of a URL as a resolver wants it: IPv6 literals without their brackets. */
export function hostOf(url: URL): string {
  const host = url.hostname;
  return host.startsWith("[") && host.endsWith("]") ? host.slice(1, -1) : host;
}

/**
 * A stand-in for a network error that keeps what helps an operator (the error code, such as
 * ENOTFOUND or ECONNREFUSED) and drops what would leak the endpoint (messages name the host,
 * address and port).
 */
export function sanitizedCause(err: unknown): Error {
  const code =
    typeof err === "object" && err !== null && "code" in err && typeof err.code === "string"
      ? err.code
      : undefined;
  const name = err instanceof Error ? err.name : "Error";
  const safe = new Error(code === undefined ? name : `${name} ${code}`);
  if (code !== undefined) Object.assign(safe, { code });
  return safe;
}
