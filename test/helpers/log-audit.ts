import { createInterface } from "node:readline";
import type { Readable } from "node:stream";

/**
 * The log audit: every log line the integration suites capture (in-process gateways through
 * `LogCapture`, child processes through their stdout and stderr) is kept here with the secrets
 * the suite handed out (API keys, operator tokens, endpoint URLs and tokens, private keys).
 * `test/setup/log-audit.ts` fails a test file whose logs contain any of them, anything shaped
 * like an API key (handed out or made up: an `x-api-key` or bearer value a client sent), or a
 * credential or private-key field of a JSON record whose value is not `[redacted]`.
 *
 * A worker runs several test files in one module instance (the unit project does not isolate
 * them: vitest.config.ts), so the audit is emptied after each file's check
 * (`test/setup/log-audit.ts`) and each file is audited against its own secrets.
 */

export type SecretKind =
  | "api key"
  | "operator token"
  | "endpoint url"
  | "endpoint token"
  | "private key"
  | "encryption key";

export interface Leak {
  readonly kind: SecretKind;
  readonly source: string;
  /** The offending line with the secret masked, so the report itself does not repeat it. */
  readonly line: string;
}

const secrets = new Map<string, SecretKind>();
const lines: { source: string; line: string }[] = [];

/** Forms a secret may take in a line: as given, and hex without its `0x` and in either case. */
function forms(value: string): string[] {
  const all = new Set([value]);
  if (/^0x[0-9a-fA-F]+$/.test(value)) {
    const bare = value.slice(2);
    for (const v of [bare, bare.toLowerCase(), bare.toUpperCase()]) all.add(v);
  }
  return [...all];
}

/** Registers a value that must never appear in a log line. Short values are ignored (false hits). */
export function auditSecret(kind: SecretKind, value: string | undefined): void {
  if (value === undefined || value.length < 12) return;
  for (const form of forms(value)) secrets.set(form, kind);
}

/** Records log output (one or more lines) from `source`. */
export function auditLog(source: string, text: string): void {
  for (const line of text.split("\n")) if (line.trim() !== "") lines.push({ source, line });
}

/** How many lines and secrets the audit holds. */
export function auditSize(): { lines: number; secrets: number } {
  return { lines: lines.length, secrets: secrets.size };
}

/**
 * What no log line may show whether or not a test handed it out: anything of an API key's shape
 * (`gw_` and 40 base62 characters: a made-up key sent to the gateway, a `x-api-key` value), and
 * any value left under a field that holds a credential or a private key.
 */
const apiKeyShape = /(?<![0-9A-Za-z_])gw_[0-9A-Za-z]{40}(?![0-9A-Za-z])/g;
const credentialFields = new Set([
  "authorization",
  "x-api-key",
  "apikey",
  "api_key",
  "privatekey",
  "private_key",
  "settlementprivatekey",
  "settlement_private_key",
  "receiptprivatekey",
  "receipt_private_key",
  "settlementoperatortoken",
  "settlement_operator_token",
  "endpointencryptionkey",
  "endpoint_encryption_key",
  "gateway_api_key",
]);

/** The credential fields of a JSON log record with a value that is not the redaction's mark. */
function unredacted(node: unknown, path: string, out: string[]): void {
  if (typeof node !== "object" || node === null) return;
  for (const [name, value] of Object.entries(node)) {
    if (credentialFields.has(name.toLowerCase()) && value !== "[redacted]" && value !== null) {
      out.push(`${path}${name}`);
    }
    unredacted(value, `${path}${name}.`, out);
  }
}

/** Every (line, secret) pair where the secret occurs in the line. */
export function findLeaks(): Leak[] {
  const leaks: Leak[] = [];
  for (const { source, line } of lines) {
    for (const [value, kind] of secrets) {
      if (line.includes(value)) {
        leaks.push({ kind, source, line: line.split(value).join(`<${kind}>`).slice(0, 500) });
      }
    }
    if (apiKeyShape.test(line)) {
      leaks.push({
        kind: "api key",
        source,
        line: line.replace(apiKeyShape, "<api key>").slice(0, 500),
      });
    }
    apiKeyShape.lastIndex = 0;
    if (line.startsWith("{")) {
      let record: unknown;
      try {
        record = JSON.parse(line);
      } catch {
        record = undefined;
      }
      const fields: string[] = [];
      unredacted(record, "", fields);
      for (const field of fields) {
        leaks.push({
          kind: /key/i.test(field) && !/api/i.test(field) ? "private key" : "api key",
          source,
          line: `${field} not redacted`,
        });
      }
    }
  }
  return leaks;
}

/** Forgets everything: after each test file's audit, and in the audit's own test. */
export function resetAudit(): void {
  secrets.clear();
  lines.length = 0;
}

/**
 * Audits a child process's logs: its stdout lines that are log records (pino JSON; other
 * stdout is the command's output, such as `dev`'s ready-to-paste curl) and all of its stderr.
 */
export function auditChildLogs(
  child: { stdout: Readable | null; stderr: Readable | null },
  source: string,
): void {
  if (child.stdout !== null) {
    createInterface({ input: child.stdout }).on("line", (line) => {
      if (isLogRecord(line)) auditLog(source, line);
    });
  }
  if (child.stderr !== null) {
    createInterface({ input: child.stderr }).on("line", (line) => auditLog(source, line));
  }
}

function isLogRecord(line: string): boolean {
  if (!line.startsWith("{")) return false;
  try {
    const record = JSON.parse(line) as { level?: unknown };
    return typeof record.level === "number" || typeof record.level === "string";
  } catch {
    return false;
  }
}
