package canary.bench;

import java.util.Collections;
import org.apache.spark.api.java.JavaRDD;
import org.apache.spark.api.java.JavaSparkContext;

/**
 * Batch gradient descent for logistic regression as a Spark JVM user writes it: one cached
 * {@code double[]} block of rows per partition, {@code mapPartitions} summing
 * {@code (sigmoid(x . w) - y) x} over the block's rows, {@code reduce} on the driver, then
 * {@code w -= 0.1 g / n}: the arithmetic of {@code peer_spark_lr} in benchmarks/apps.py
 * (no intercept).
 */
public final class LogisticRegression {
    private LogisticRegression() {}

    /**
     * Runs {@code iters} iterations from {@code w = 0} over the {@code n x (d + 1)} row-major
     * float64 file at {@code path} (features then label per row), split into {@code parts}
     * partitions as {@code np.array_split}. Loading and caching happen before the first timed
     * iteration.
     *
     * @return little-endian float64 bytes: [seconds of each iteration (iters), final w (d),
     *     seconds to load and cache the data (1)]
     */
    public static byte[] run(JavaSparkContext jsc, String path, int n, int d, int parts,
                             int iters) {
        final long[] lo = Io.split(n, parts);
        final int width = d + 1;
        long t0 = System.nanoTime();
        JavaRDD<double[]> blocks = jsc.parallelize(Io.ids(parts), parts)
            .map(p -> Io.readDoubles(path, 8L * width * lo[p],
                                     Math.toIntExact(width * (lo[p + 1] - lo[p]))))
            .cache();
        blocks.count();
        double load = (System.nanoTime() - t0) / 1e9;
        double[] w = new double[d];
        double[] seconds = new double[iters];
        for (int it = 0; it < iters; it++) {
            long start = System.nanoTime();
            final double[] ww = w; // captured by the closure, shipped with every task
            double[] g = blocks.mapPartitions(rows -> {
                double[] acc = new double[d];
                while (rows.hasNext()) {
                    double[] b = rows.next();
                    for (int o = 0; o < b.length; o += width) {
                        double z = 0.0;
                        for (int j = 0; j < d; j++) {
                            z += b[o + j] * ww[j];
                        }
                        double r = 1.0 / (1.0 + Math.exp(-z)) - b[o + d];
                        for (int j = 0; j < d; j++) {
                            acc[j] += r * b[o + j];
                        }
                    }
                }
                return Collections.singletonList(acc).iterator();
            }).reduce((a, b) -> {
                for (int j = 0; j < a.length; j++) {
                    a[j] += b[j];
                }
                return a;
            });
            double[] next = new double[d];
            for (int j = 0; j < d; j++) {
                next[j] = w[j] - 0.1 * g[j] / n;
            }
            w = next;
            seconds[it] = (System.nanoTime() - start) / 1e9;
        }
        blocks.unpersist(true);
        return Io.toBytes(seconds, w, new double[] {load});
    }
}
