import type { Hex } from "viem";
import type { CloseRecord } from "../chat/types.js";

/**
 * The port of the lease ledger (leases.ts) to its storage (adapters/pg/leases.ts, migration
 * 010): taking and giving back leases, and a leased request's record and close.
 */

export interface PermitLeaseRequest {
  readonly holder: string;
  readonly permitId: Hex;
  readonly need: bigint;
  readonly want: bigint;
  readonly deposit: bigint;
  readonly chainSettled: bigint;
}

export interface OfferLeaseRequest {
  readonly holder: string;
  readonly offerId: Hex;
  readonly need: number;
  readonly want: number;
  readonly maxConcurrency: number;
}

/** A leased request's record, as written while its upstream call runs. */
export interface LeasedRecord {
  readonly requestId: Hex;
  readonly apiKeyId: string;
  readonly holder: string;
  readonly model: string;
  readonly modelId: Hex;
  offerId: Hex;
  readonly permitId: Hex;
  readonly quoteId: Hex;
  readonly stream: boolean;
  maximumCredits: bigint;
  tariffVersion: bigint;
  readonly inputTokens: bigint;
  /** The permit authorization that admitted it (never one with a total cap: those are not leased). */
  readonly authorizationId?: string | undefined;
}

/** A leased request's close: its record's columns and the close's, in one write. */
export interface LeasedClose extends CloseRecord {
  readonly record: LeasedRecord;
}

/** The record write's progress, which the store updates and reads when it sends the batch. */
export interface OpenState {
  sent: boolean;
  skip: boolean;
  streaming: boolean;
}

/** adapters/pg/leases.ts. Each take/return is one transaction; record writes are batched. */
export interface LeaseStore {
  /**
   * Credits granted (at least `need`, at most `want`); 0: refused; -1: refused, but other
   * holders' leases hold enough that it may fit once they give back their idle part.
   */
  takePermit(r: PermitLeaseRequest): Promise<bigint>;
  takeOffer(r: OfferLeaseRequest): Promise<number>;
  /** Gives back part of a lease, or all of it ("all": whatever the database holds). */
  returnPermit(holder: string, permitId: Hex, credits: bigint | "all"): Promise<bigint>;
  returnOffer(holder: string, offerId: Hex, slots: number | "all"): Promise<number>;
  heartbeat(holder: string): Promise<void>;
  /** Writes the record unless `state.skip` is set before its batch is sent. */
  open(record: LeasedRecord, state: OpenState): Promise<void>;
  markStreaming(requestId: Hex): Promise<void>;
  close(close: LeasedClose): Promise<{ finalized: boolean; creditsCharged: bigint }>;
}

/**
 * Lease recall between processes (adapters/pg/lease-signals.ts: PostgreSQL LISTEN/NOTIFY). A
 * process whose extension is refused while other holders' leases would cover it asks them for
 * their idle part; each holder gives back what its requests do not use and answers.
 */
export interface LeaseSignals {
  /** Asks the other processes to give back their idle part of `key` (`permit:0x..`,
   * `offer:0x..`); resolves when one answers, or after a bound (never rejects). */
  recall(key: string): Promise<void>;
  /** This process has answered a recall of `key` (given back what it could). */
  answer(key: string): Promise<void>;
  /** Called with the key of every recall another process sends. */
  onRecall(handler: (key: string) => void): void;
}
