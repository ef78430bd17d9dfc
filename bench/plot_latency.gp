# Latency of small-tensor Observe against concurrency, qparams next to the in-process
# echo server. bench/run.sh calls: gnuplot -e "datafile='...'; outfile='...'" this file.
# Columns of datafile: concurrency, qparams p50, p99, echo p50, p99 (microseconds).
set terminal pngcairo size 800,500 font "sans,10"
set output outfile
set title "Observe of a 64-float tensor: latency vs concurrency (client and server on one 2-core host)"
set xlabel "concurrent callers"
set ylabel "latency (µs)"
set logscale x 2
set logscale y
set grid
set key top left
plot datafile using 1:2 with linespoints lw 2 pt 7 lc rgb "#1f77b4" title "qparams p50", \
     datafile using 1:3 with linespoints lw 2 pt 5 lc rgb "#1f77b4" dt 2 title "qparams p99", \
     datafile using 1:4 with linespoints lw 2 pt 7 lc rgb "#ff7f0e" title "echo p50", \
     datafile using 1:5 with linespoints lw 2 pt 5 lc rgb "#ff7f0e" dt 2 title "echo p99"
