import {
  type KyselyPlugin,
  OperationNodeTransformer,
  type PluginTransformQueryArgs,
  type PluginTransformResultArgs,
  type PrimitiveValueListNode,
  type QueryResult,
  type RootOperationNode,
  type UnknownRow,
  type ValueNode,
} from 'kysely'

const NUL = /\u0000/g

/** A string PostgreSQL's text can hold: NUL, which it refuses (22021), becomes U+FFFD. */
export function postgresText(value: string): string {
  return value.includes('\u0000') ? value.replace(NUL, '\uFFFD') : value
}

function storable(value: unknown): unknown {
  return typeof value === 'string' ? postgresText(value) : value
}

class NulReplacer extends OperationNodeTransformer {
  protected override transformValue(node: ValueNode): ValueNode {
    return typeof node.value === 'string' ? { ...node, value: postgresText(node.value) } : node
  }

  protected override transformPrimitiveValueList(node: PrimitiveValueListNode): PrimitiveValueListNode {
    return { ...node, values: node.values.map(storable) }
  }
}

/**
 * PostgreSQL's text cannot hold the NUL character, which SQLite stores and clients may send
 * (a name in a URL, a prompt, an agent's output): every string a query carries has it replaced,
 * so a lookup by such a name finds nothing (404) and a turn's output is kept, instead of the
 * statement failing with a 500 or a turn's end being lost.
 */
export class PostgresTextPlugin implements KyselyPlugin {
  private readonly replacer = new NulReplacer()

  transformQuery(args: PluginTransformQueryArgs): RootOperationNode {
    return this.replacer.transformNode(args.node)
  }

  async transformResult(args: PluginTransformResultArgs): Promise<QueryResult<UnknownRow>> {
    return args.result
  }
}
