package canary.bench;

import java.util.ArrayList;
import java.util.Arrays;
import java.util.List;
import org.apache.spark.api.java.JavaRDD;
import org.apache.spark.api.java.JavaSparkContext;
import org.apache.spark.graphx.Edge;
import org.apache.spark.graphx.Graph;
import org.apache.spark.graphx.lib.PageRank;
import org.apache.spark.storage.StorageLevel;
import scala.Tuple2;
import scala.reflect.ClassTag;
import scala.reflect.ClassTag$;

/**
 * GraphX's own PageRank, {@code org.apache.spark.graphx.lib.PageRank.run}, on a graph built
 * with {@code Graph.fromEdges} (Int vertex and edge attributes, as {@code Graph.fromEdges(edges,
 * 1)} gives in Scala) and cached.
 *
 * <p>{@code run} does all its iterations in one call, so one iteration is timed as a
 * difference: after a warm-up call, {@code T(k)} and {@code T(k + extra)} are the wall times
 * of one call each (graph preparation, the iterations, the final normalisation and a count of
 * the result's vertices); {@code (T(k + extra) - T(k)) / extra} is the per-iteration time,
 * preparation and normalisation cancelling.
 */
public final class GraphXPageRank {
    private GraphXPageRank() {}

    private static Graph<Object, Object> pageRank(Graph<Object, Object> g, int iters,
                                                  ClassTag<Object> tag) {
        return PageRank.run(g, iters, 0.15, tag, tag);
    }

    /**
     * Builds the graph of the {@code e} edges (int64 source, destination pairs) in
     * {@code path} over {@code parts} edge partitions, then calls {@code PageRank.run} with
     * {@code k} iterations (warm-up, untimed), {@code k} (timed) and {@code k + extra} (timed),
     * reset probability 0.15.
     *
     * @return little-endian float64 bytes: [T(k), T(k + extra), seconds to build and cache the
     *     graph, the warm-up call's seconds, then the rank of each vertex 0..v-1 after
     *     {@code k + extra} iterations as {@code run} returns it (normalised by GraphX to sum
     *     to the number of vertices in the graph), NaN for a vertex not in any edge (v)]
     */
    public static byte[] run(JavaSparkContext jsc, String path, int e, int v, int parts, int k,
                             int extra) {
        final long[] lo = Io.split(e, parts);
        ClassTag<Object> intTag = ClassTag$.MODULE$.Int(); // Scala's Int: primitive arrays
        long t0 = System.nanoTime();
        JavaRDD<Edge<Object>> edges = jsc.parallelize(Io.ids(parts), parts).flatMap(p -> {
            long[] a = Io.readLongs(path, 16L * lo[p], Math.toIntExact(2 * (lo[p + 1] - lo[p])));
            List<Edge<Object>> out = new ArrayList<>(a.length / 2);
            for (int i = 0; i < a.length; i += 2) {
                out.add(new Edge<>(a[i], a[i + 1], 1));
            }
            return out.iterator();
        });
        Graph<Object, Object> graph = Graph.fromEdges(edges.rdd(), (Object) 1,
            StorageLevel.MEMORY_ONLY(), StorageLevel.MEMORY_ONLY(), intTag, intTag).cache();
        graph.edges().count();
        graph.vertices().count();
        double setup = (System.nanoTime() - t0) / 1e9;
        double[] times = new double[3]; // warm-up T(k), T(k), T(k + extra)
        int[] counts = {k, k, k + extra};
        Graph<Object, Object> last = null;
        for (int i = 0; i < 3; i++) {
            long start = System.nanoTime();
            Graph<Object, Object> ranks = pageRank(graph, counts[i], intTag);
            ranks.vertices().count(); // the final normalisation is a lazy mapVertices
            times[i] = (System.nanoTime() - start) / 1e9;
            if (last != null) {
                last.unpersist(false);
            }
            last = ranks;
        }
        double[] dense = new double[v];
        Arrays.fill(dense, Double.NaN);
        for (Tuple2<Object, Object> kv : last.vertices().toJavaRDD().collect()) {
            dense[Math.toIntExact((Long) kv._1())] = (Double) kv._2();
        }
        last.unpersist(false);
        graph.unpersist(false);
        return Io.toBytes(new double[] {times[1], times[2], setup, times[0]}, dense);
    }
}
