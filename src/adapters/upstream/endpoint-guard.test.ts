import { describe, expect, it } from "vitest";
import { GatewayError } from "../../domain/errors.js";
import {
  canonicalEndpointUrl,
  isAllowedAddress,
  resolveEndpoint,
  type LookupAll,
} from "./endpoint-guard.js";

async function refusal(promise: Promise<unknown>): Promise<GatewayError> {
  const err: unknown = await promise.then(
    () => undefined,
    (e: unknown) => e,
  );
  expect(err).toBeInstanceOf(GatewayError);
  return err as GatewayError;
}

function staticLookup(table: Record<string, string[]>): LookupAll {
  return async (host) => {
    const addresses = table[host];
    if (addresses === undefined) {
      throw Object.assign(new Error(`getaddrinfo ENOTFOUND ${host}`), { code: "ENOTFOUND" });
    }
    return addresses.map((address) => ({ address, family: address.includes(":") ? 6 : 4 }));
  };
}

describe("canonicalEndpointUrl", () => {
  it.each([
    ["HTTP://Example.COM:80/a/b/", "http://example.com/a/b"],
    ["https://example.com:443", "https://example.com/"],
    ["https://example.com/", "https://example.com/"],
    ["https://example.com/base//", "https://example.com/base"],
    ["https://example.com:8443/base?x=1", "https://example.com:8443/base?x=1"],
    ["https://example.com/base?", "https://example.com/base"],
    ["http://2130706433/", "http://127.0.0.1/"],
    ["http://0x7f.1/", "http://127.0.0.1/"],
    ["http://[0:0:0:0:0:FFFF:A9FE:A9FE]/", "http://[::ffff:a9fe:a9fe]/"],
    ["http://%31%32%37.0.0.1/", "http://127.0.0.1/"],
  ])("%s -> %s", (input, expected) => {
    expect(canonicalEndpointUrl(input)).toBe(expected);
    // Idempotent: the gateway may canonicalise a canonical URL again and hash the same bytes.
    expect(canonicalEndpointUrl(expected)).toBe(expected);
  });

  it.each([
    ["not a url", "not a valid absolute URL"],
    ["/relative/path", "not a valid absolute URL"],
    ["ftp://files.example.com/", "must use http or https"],
    ["file:///etc/passwd", "must use http or https"],
    ["https://user:secret-pw@example.com/", "must not contain user info"],
    ["https://user@example.com/", "must not contain user info"],
    ["https://example.com/#frag", "must not contain a fragment"],
    ["https://example.com/#", "must not contain a fragment"],
    [`https://example.com/${"a".repeat(2100)}`, "longer than"],
  ])("refuses %s", (input, message) => {
    let caught: unknown;
    try {
      canonicalEndpointUrl(input);
    } catch (err) {
      caught = err;
    }
    expect(caught).toBeInstanceOf(GatewayError);
    const err = caught as GatewayError;
    expect(err.code).toBe("invalid_request");
    expect(err.message).toContain(message);
    expect(err.message).not.toContain("example.com");
    expect(err.message).not.toContain("secret-pw");
  });
});

describe("isAllowedAddress", () => {
  it.each([
    "127.0.0.1",
    "127.1.2.3",
    "10.0.0.1",
    "172.16.0.1",
    "172.31.255.255",
    "192.168.1.1",
    "169.254.169.254",
    "169.254.0.1",
    "100.64.0.1",
    "100.100.100.200",
    "0.0.0.0",
    "0.1.2.3",
    "255.255.255.255",
    "224.0.0.1",
    "240.0.0.1",
    "192.0.2.1",
    "198.18.0.1",
    "::",
    "::1",
    "fc00::1",
    "fd00:ec2::254",
    "fe80::1",
    "fe80::1%eth0",
    "fec0::1",
    "ff02::1",
    "::ffff:a9fe:a9fe",
    "::ffff:169.254.169.254",
    "::ffff:127.0.0.1",
    "::ffff:10.0.0.1",
    "::ffff:0:7f00:1",
    "64:ff9b::7f00:1",
    "64:ff9b::a9fe:a9fe",
    "64:ff9b:1::5db8:d822",
    "2002:7f00:1::1",
    "2002:a9fe:a9fe::1",
    "2001:0:4136:e378:8000:63bf:3fff:fdd2",
    "2001:db8::1",
    "100::1",
    "4000::1",
    "2130706433",
    "0x7f.1",
    "localhost",
    "",
  ])("refuses %s", (ip) => {
    expect(isAllowedAddress(ip)).toBe(false);
  });

  it.each([
    "93.184.216.34",
    "8.8.8.8",
    "1.1.1.1",
    "2606:4700:4700::1111",
    "2001:4860:4860::8888",
    "::ffff:93.184.216.34",
    "64:ff9b::5db8:d822",
    "2002:5db8:d822::1",
  ])("allows %s", (ip) => {
    expect(isAllowedAddress(ip)).toBe(true);
  });
});

describe("resolveEndpoint", () => {
  const evil = staticLookup({
    "evil.example": ["127.0.0.1"],
    "rebind.example": ["93.184.216.34", "10.0.0.7"],
    "good.example": ["93.184.216.34", "2606:2800:220:1:248:1893:25c8:1946"],
    "v6.example": ["2606:2800:220:1:248:1893:25c8:1946"],
  });

  it.each([
    "http://169.254.169.254/",
    "http://[::ffff:a9fe:a9fe]/",
    "http://10.0.0.1/",
    "http://2130706433/",
    "http://[::1]/",
    "http://100.64.0.1/",
    "http://0.0.0.0/",
    "http://[fd00:ec2::254]/",
    "http://evil.example/",
    "https://evil.example:8443/v1",
    "http://rebind.example/",
  ])("refuses %s", async (url) => {
    const err = await refusal(resolveEndpoint(url, { allowPrivate: false, lookup: evil }));
    expect(err.code).toBe("endpoint_not_allowed");
    expect(err.message).toBe("endpoint host resolves to a non-public address");
  });

  it("refuses a name the system resolver maps to loopback", async () => {
    const err = await refusal(resolveEndpoint("http://localhost:8080/", { allowPrivate: false }));
    expect(err.code).toBe("endpoint_not_allowed");
  });

  it("allows a public literal and returns it as the address to connect to", async () => {
    const resolved = await resolveEndpoint("http://93.184.216.34/base/", { allowPrivate: false });
    expect(resolved).toEqual({
      url: new URL("http://93.184.216.34/base"),
      address: "93.184.216.34",
      family: 4,
    });
  });

  it("returns the first resolved address of a public name", async () => {
    const resolved = await resolveEndpoint("https://good.example/", {
      allowPrivate: false,
      lookup: evil,
    });
    expect(resolved.address).toBe("93.184.216.34");
    expect(resolved.family).toBe(4);
    expect(resolved.url.hostname).toBe("good.example");
    const v6 = await resolveEndpoint("https://v6.example/", { allowPrivate: false, lookup: evil });
    expect(v6).toMatchObject({ address: "2606:2800:220:1:248:1893:25c8:1946", family: 6 });
  });

  it("lets loopback through when private addresses are allowed", async () => {
    const resolved = await resolveEndpoint("http://127.0.0.1:3000/", { allowPrivate: true });
    expect(resolved).toMatchObject({ address: "127.0.0.1", family: 4 });
    const named = await resolveEndpoint("http://evil.example/", {
      allowPrivate: true,
      lookup: evil,
    });
    expect(named.address).toBe("127.0.0.1");
    const v6 = await resolveEndpoint("http://[::1]:3000/", { allowPrivate: true });
    expect(v6).toMatchObject({ address: "::1", family: 6 });
  });

  it("reports an unresolvable host without naming it", async () => {
    const err = await refusal(
      resolveEndpoint("https://missing.example/", { allowPrivate: false, lookup: evil }),
    );
    expect(err.code).toBe("upstream_unavailable");
    expect(err.message).not.toContain("missing.example");
    expect(String((err.cause as Error).message)).not.toContain("missing.example");
    expect((err.cause as { code?: string }).code).toBe("ENOTFOUND");
  });

  it("validates the URL first", async () => {
    const err = await refusal(
      resolveEndpoint("https://u:p@good.example/", { allowPrivate: false, lookup: evil }),
    );
    expect(err.code).toBe("invalid_request");
  });
});
