import * as grpc from "@grpc/grpc-js";
import {
  create,
  fromBinary,
  toBinary,
  type DescMessage,
  type MessageInitShape,
  type MessageShape,
} from "@bufbuild/protobuf";
import type { DescMethod } from "@bufbuild/protobuf";

/**
 * A native @grpc/grpc-js client for any method of our services, with the
 * generated protobuf-es schemas doing (de)serialisation: what an internal
 * service in another stack would use.
 */
export function grpcClient(baseUrl: string): grpc.Client {
  return new grpc.Client(new URL(baseUrl).host, grpc.credentials.createInsecure());
}

function path(method: DescMethod): string {
  return `/${method.parent.typeName}/${method.name}`;
}

export function grpcUnary<I extends DescMessage, O extends DescMessage>(
  client: grpc.Client,
  method: DescMethod & { input: I; output: O },
  input: MessageInitShape<I>,
  metadata: Record<string, string> = {},
): Promise<MessageShape<O>> {
  const md = new grpc.Metadata();
  for (const [k, v] of Object.entries(metadata)) md.set(k, v);
  return new Promise((resolve, reject) => {
    client.makeUnaryRequest(
      path(method),
      (value: MessageShape<I>) => Buffer.from(toBinary(method.input, value)),
      (bytes: Buffer) => fromBinary(method.output, bytes),
      create(method.input, input),
      md,
      (error, value) => (error ? reject(error) : resolve(value as MessageShape<O>)),
    );
  });
}

export async function grpcServerStream<I extends DescMessage, O extends DescMessage>(
  client: grpc.Client,
  method: DescMethod & { input: I; output: O },
  input: MessageInitShape<I>,
  metadata: Record<string, string> = {},
): Promise<MessageShape<O>[]> {
  const md = new grpc.Metadata();
  for (const [k, v] of Object.entries(metadata)) md.set(k, v);
  const call = client.makeServerStreamRequest(
    path(method),
    (value: MessageShape<I>) => Buffer.from(toBinary(method.input, value)),
    (bytes: Buffer) => fromBinary(method.output, bytes),
    create(method.input, input),
    md,
  );
  const out: MessageShape<O>[] = [];
  for await (const message of call) out.push(message as MessageShape<O>);
  return out;
}
