package canary.bench;

import java.util.ArrayList;
import java.util.Arrays;
import java.util.List;
import java.util.Map;
import org.apache.spark.HashPartitioner;
import org.apache.spark.api.java.JavaPairRDD;
import org.apache.spark.api.java.JavaSparkContext;
import scala.Tuple2;

/**
 * The classic Spark RDD PageRank in the JVM (Spark's own JavaPageRank example, with the
 * formula of {@code peer_spark_pagerank} in benchmarks/apps.py): links (source to its
 * out-neighbours, duplicates kept) hash-partitioned and cached; each iteration
 * {@code links.join(ranks)}, every source sends {@code rank / outdegree} to each neighbour,
 * {@code reduceByKey}, then {@code 0.15 / v + 0.85 * sum}. As in that peer, only vertices with
 * out-edges start with a rank (1 / v), a vertex that receives nothing drops out, and dangling
 * mass is lost.
 */
public final class PageRankJoin {
    private PageRankJoin() {}

    /**
     * Runs {@code iters} iterations over the {@code e} edges (int64 source, destination pairs)
     * in {@code path}, on {@code v} vertices and {@code parts} partitions.
     *
     * @return little-endian float64 bytes: [seconds of each iteration (iters), the rank of each
     *     vertex 0..v-1, NaN where the vertex has no rank (v), seconds to build and cache the
     *     links (1)]
     */
    public static byte[] run(JavaSparkContext jsc, String path, int e, int v, int parts,
                             int iters) {
        final long[] lo = Io.split(e, parts);
        final HashPartitioner part = new HashPartitioner(parts);
        long t0 = System.nanoTime();
        JavaPairRDD<Long, long[]> links = jsc.parallelize(Io.ids(parts), parts)
            .flatMapToPair(p -> {
                long[] a = Io.readLongs(path, 16L * lo[p], Math.toIntExact(2 * (lo[p + 1] - lo[p])));
                List<Tuple2<Long, Long>> out = new ArrayList<>(a.length / 2);
                for (int i = 0; i < a.length; i += 2) {
                    out.add(new Tuple2<>(a[i], a[i + 1]));
                }
                return out.iterator();
            })
            .groupByKey(part)
            .mapValues(nbrs -> {
                long[] out = new long[16];
                int m = 0;
                for (long x : nbrs) {
                    if (m == out.length) {
                        out = Arrays.copyOf(out, 2 * m);
                    }
                    out[m++] = x;
                }
                return Arrays.copyOf(out, m);
            })
            .cache();
        links.count();
        double setup = (System.nanoTime() - t0) / 1e9;
        final double v0 = 1.0 / v;
        JavaPairRDD<Long, Double> ranks = links.mapValues(x -> v0);
        double[] seconds = new double[iters];
        for (int it = 0; it < iters; it++) {
            long start = System.nanoTime();
            JavaPairRDD<Long, Double> next = links.join(ranks).values()
                .flatMapToPair(t -> {
                    long[] nbrs = t._1();
                    double share = t._2() / nbrs.length;
                    List<Tuple2<Long, Double>> out = new ArrayList<>(nbrs.length);
                    for (long dst : nbrs) {
                        out.add(new Tuple2<>(dst, share));
                    }
                    return out.iterator();
                })
                .reduceByKey(part, Double::sum)
                .mapValues(r -> 0.15 / v + 0.85 * r)
                .cache();
            next.count();
            if (it > 0) {
                ranks.unpersist(false); // the previous iteration's cached ranks
            }
            ranks = next;
            seconds[it] = (System.nanoTime() - start) / 1e9;
        }
        double[] dense = new double[v];
        Arrays.fill(dense, Double.NaN);
        for (Map.Entry<Long, Double> kv : ranks.collectAsMap().entrySet()) {
            dense[Math.toIntExact(kv.getKey())] = kv.getValue();
        }
        ranks.unpersist(false);
        links.unpersist(false);
        return Io.toBytes(seconds, dense, new double[] {setup});
    }
}
